"""A run of the suite fails within minutes when a worker dies or a test hangs, never hangs.

With xdist's default a crashed worker is replaced, and under ``--dist loadgroup`` the run then
waited forever (twice in CI, until its 90-minute limit, after a segfault inside XLA). The
Makefile's xdist options (``XDIST``) end the run at the first crash instead, and
pytest-timeout (``[tool.pytest.ini_options]``: ``timeout``, ``timeout_method``) turns a hung
test into such a crash. Each test here runs a small session in a subprocess with exactly those
options: one test of it dies (a segfault) or hangs, the others pass.
"""

import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INI = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]

HEALTHY = """
import time

import pytest


@pytest.mark.parametrize("i", range(12))
def test_healthy(i):
    time.sleep(0.2)


@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    time.sleep(0.2)
"""
DIES = f"""
import os


def test_dies():
    os.kill(os.getpid(), {int(signal.SIGSEGV)})
"""
HANGS = """
import time


def test_hangs():
    time.sleep(3600)
"""


def makefile_xdist_options() -> list[str]:
    """The pytest options of the Makefile's ``XDIST :=`` line (what make test and CI use)."""
    text = (ROOT / "Makefile").read_text()
    (line,) = re.findall(r"^XDIST\s*:=\s*(.+)$", text, flags=re.MULTILINE)
    return line.split()


def run_session(tmp_path: Path, bad_module: str, timeout_s: int) -> subprocess.CompletedProcess:
    run = tmp_path / "run"
    run.mkdir()
    (run / "pytest.ini").write_text("[pytest]\n")
    (run / "test_healthy.py").write_text(HEALTHY)
    (run / "test_bad.py").write_text(bad_module)
    argv = [sys.executable, "-m", "pytest", *makefile_xdist_options(), "-q"]
    argv += ["-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base")]
    argv += ["-o", f"timeout={timeout_s}", "-o", f"timeout_method={INI['timeout_method']}"]
    # A hung session would outlive this limit (TimeoutExpired fails the test); a failing
    # one ends in seconds.
    return subprocess.run(argv, cwd=run, capture_output=True, text=True, timeout=240)


def test_the_suite_has_a_per_test_timeout_that_ends_a_hung_worker():
    assert 0 < int(INI["timeout"]) <= 1800
    assert INI["timeout_method"] == "thread"  # "signal" cannot interrupt a hang inside C code
    assert "--max-worker-restart=0" in makefile_xdist_options()


@pytest.mark.parametrize(
    "bad_module, test_name",
    [(DIES, "test_dies"), (HANGS, "test_hangs")],
    ids=["worker-segfaults", "test-hangs"],
)
def test_a_session_with_a_dead_worker_fails_and_ends(tmp_path, bad_module, test_name):
    proc = run_session(tmp_path, bad_module, timeout_s=5)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert re.search(rf"worker 'gw\d' crashed while running 'test_bad.py::{test_name}'", out), out
    assert f"FAILED test_bad.py::{test_name}" in out, out
    # The session stopped there: the other worker finished what it had been given, and none
    # of the healthy tests failed.
    assert re.search(r"1 failed, \d+ passed", out), out
