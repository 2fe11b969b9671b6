"""``--dist loadgroup`` (``make test``) keeps an ``xdist_group``'s tests on one worker, so a
group's session fixtures are built once (a sweep, a mesh of processes). With pytest 9.2 and
xdist 3.8 the marks were silently ignored (pytest-dev/pytest-xdist#1386): pyproject.toml
pins pytest below 9, and this test fails if a resolved pair breaks the grouping again."""

import os
import subprocess
import sys

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    out = os.path.join(os.environ["GROUP_OUT"], f"worker_{i}")
    with open(out, "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""
LOOSE = """
import pytest


@pytest.mark.parametrize("i", range(6))
def test_loose(i):
    pass
"""


def test_a_groups_tests_run_on_one_worker(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "pytest.ini").write_text("[pytest]\n")
    (run / "test_grouped.py").write_text(GROUPED)
    (run / "test_loose.py").write_text(LOOSE)
    argv = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q"]
    argv += ["-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base")]
    env = {**os.environ, "GROUP_OUT": str(tmp_path)}
    proc = subprocess.run(argv, cwd=run, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = {(tmp_path / f"worker_{i}").read_text() for i in range(6)}
    assert len(workers) == 1, f"one group ran on workers {sorted(workers)}"
