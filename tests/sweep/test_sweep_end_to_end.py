"""A tiny sweep through the CLI (2 seeds x 2 learning rates of a tiny reverse config): its
records, table and figures; each run equal to a plain ``train.py`` run of the same config
(every metrics record, timing aside); a rerun trains nothing; a sweep stopped by SIGINT
mid-run resumes and ends with the records of the uninterrupted one.

The runs are ``train.py`` children sharing the tests' JAX compilation cache (conftest.py), so
only the first run of a shape compiles."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tfmjax.config import load
from tfmjax.reporting.metrics_log import deterministic_part, read_records

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/reverse.toml"
STEPS = 100
TINY = [
    "model.d_model=16",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.d_ff=32",
    "data.batch_size=8",
    "data.eval_examples=16",
    f"train.steps={STEPS}",
    "train.log_every=10",
    "train.eval_every=50",
    "train.checkpoint_every=20",
    "optim.warmup_steps=5",
]
BASE = load(ROOT / CONFIG, TINY)
GRID = ["--seeds", "0,1", "--grid", "optim.learning_rate=1e-3,3e-3", "--jobs", "2"]
RUNS = [f"learning_rate={lr}/seed={s}" for lr in ("1e-3", "3e-3") for s in (0, 1)]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PNG = b"\x89PNG"


def sweep_argv(workdir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tfmjax.sweep", CONFIG, *TINY, *extra, "--workdir", str(workdir)]


def sweep(workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = sweep_argv(workdir, *extra)
    return subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)


def metrics(workdir: Path) -> list[dict]:
    return [deterministic_part(r) for r in read_records(workdir / "metrics.jsonl")]


# One xdist worker runs the module and trains the sweep once (about 60 s). Without the group
# each worker that drew one of its tests trained it: with pytest 9.2 xdist ignored the group
# (two ~120 s setups in a fresh-clone run), hence pytest < 9 in pyproject.toml.
pytestmark = pytest.mark.xdist_group("sweep_end_to_end")


@pytest.fixture(scope="session")
def swept(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sweep")
    proc = sweep(workdir, *GRID)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workdir, proc.stdout


def test_records_table_and_figures(swept):
    workdir, out = swept
    records = [json.loads(line) for line in (workdir / "sweep.jsonl").read_text().splitlines()]
    assert [r["run"] for r in records] == RUNS
    for r in records:
        assert r["status"] == "done" and r["step"] == STEPS and r["final"]["step"] == STEPS
        lr, seed = float(r["point"]["optim.learning_rate"]), r["seed"]
        # the differences from the base config (learning rate 3e-3, seed 0)
        assert r["changes"].get("optim.learning_rate", BASE.optim.learning_rate) == lr
        assert r["changes"].get("train.seed", BASE.train.seed) == seed
        assert set(r["changes"]) <= {"optim.learning_rate", "train.seed"}
        assert "train.workdir" not in r["changes"] and r["wall_sec"] > 0
        run_dir = Path(r["workdir"])
        assert (run_dir / "checkpoints" / str(STEPS)).is_dir()
        assert (run_dir / "metrics.png").read_bytes()[:4] == PNG
        evals = [m for m in metrics(run_dir) if m["split"] == "eval"]
        assert r["final"]["exact_match"] == evals[-1]["exact_match"]
        assert r["best"]["exact_match"] == max(m["exact_match"] for m in evals)
    for point in ("learning_rate=1e-3", "learning_rate=3e-3"):
        finals = [r["final"]["exact_match"] for r in records if r["run"].startswith(point + "/")]
        row = next(line.split() for line in out.splitlines() if line.startswith(point + " "))
        assert row[1] == "2/2"
        assert row[2] == f"{np.mean(finals):.4f}" and row[4] == f"{np.std(finals, ddof=1):.4f}"
        assert row[5:7] == [f"{min(finals):.4f}", f"{max(finals):.4f}"]
    for figure in ("metric.png", "curves.png"):
        assert (workdir / figure).read_bytes()[:4] == PNG


@pytest.mark.parametrize("run", [RUNS[1], RUNS[2]])
def test_a_run_equals_a_plain_train_py_run(swept, run, tmp_path):
    workdir, _ = swept
    lr, seed = re.fullmatch(r"learning_rate=(.+)/seed=(\d+)", run).groups()
    argv = [sys.executable, "train.py", CONFIG, *TINY, f"optim.learning_rate={lr}"]
    argv += [f"train.seed={seed}", f"train.workdir={tmp_path}"]
    proc = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    alone = metrics(tmp_path)
    assert len(alone) == STEPS // 10 + 2  # train records, two evals
    assert metrics(workdir / run) == alone


def test_a_rerun_trains_nothing(swept):
    workdir, _ = swept
    before = {run: (workdir / run / "metrics.jsonl").stat().st_mtime_ns for run in RUNS}
    records = (workdir / "sweep.jsonl").read_text()
    proc = sweep(workdir, *GRID)
    assert proc.returncode == 0, proc.stderr
    assert "4 done, nothing to train" in proc.stdout and "start " not in proc.stdout
    assert {run: (workdir / run / "metrics.jsonl").stat().st_mtime_ns for run in RUNS} == before
    assert (workdir / "sweep.jsonl").read_text() == records


def _wait_for_first_step(workdir: Path, proc: subprocess.Popen, runs: list[str]) -> None:
    """Until a run in flight has trained its first step (its train.log says so)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        for run in runs:
            log = workdir / run / "train.log"
            if log.exists() and "compiled and ran the first step" in log.read_text():
                return
        time.sleep(0.02)
    pytest.fail("no run reached its first step")


def test_sigint_stops_the_runs_in_flight_and_a_rerun_finishes_them(swept, tmp_path):
    done, _ = swept
    runs = RUNS[:2]  # learning rate 1e-3, seeds 0 and 1: both at once
    grid = ["--seeds", "0,1", "--grid", "optim.learning_rate=1e-3", "--jobs", "2"]
    proc = subprocess.Popen(
        sweep_argv(tmp_path, *grid), cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True
    )
    _wait_for_first_step(tmp_path, proc, runs)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out
    assert "SIGINT: the runs in flight saved and stopped" in out
    assert any(not (tmp_path / run / "checkpoints" / str(STEPS)).exists() for run in runs), out
    rerun = sweep(tmp_path, *grid)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    for run in runs:
        assert metrics(tmp_path / run) == metrics(done / run)


def test_a_failing_run_is_reported_with_its_last_line_and_exit_1(tmp_path):
    """The loader accepts train.best_metric=bits_per_char; building the run on a toy task
    refuses it (train.py exit 2): the sweep names the run and the reason, and exits 1."""
    proc = sweep(tmp_path, "train.best_metric=bits_per_char", "--metric", "exact_match")
    assert proc.returncode == 1
    line = next(line for line in proc.stdout.splitlines() if line.startswith("failed "))
    assert line.startswith("failed base/seed=0 in ") and "exit 2: error: train.best_metric" in line
    assert "1 run(s) failed: base/seed=0" in proc.stderr
    record = json.loads((tmp_path / "sweep.jsonl").read_text())
    assert record["status"] == "failed" and record["final"] == {}


def test_the_one_program_executor_gives_the_process_runs_records(swept, tmp_path):
    """--executor vmap on the grid over optim.learning_rate: its 2 points x 2 seeds share
    every shape, so one vmapped program trains all 4, in the sweep's own process, each run
    with its own learning rate; each run's records equal the process run's within 1e-5
    relative (batched kernels round differently), timing aside."""
    done, _ = swept
    proc = sweep(tmp_path, *GRID, "--executor", "vmap")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 to train as 1 program(s), one per shape" in proc.stdout
    assert proc.stdout.count("program 1/1: 4 run(s)") == 1
    assert "program 2/" not in proc.stdout
    for run in RUNS:
        log = (tmp_path / run / "train.log").read_text().splitlines()
        assert log[0] == f"one program of 4 run(s): {', '.join(RUNS)}"
        got, want = metrics(tmp_path / run), metrics(done / run)
        assert len(got) == len(want) == STEPS // 10 + 2
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            for key, value in w.items():
                if isinstance(value, float):
                    assert g[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (run, key)
                else:
                    assert g[key] == value
        assert (tmp_path / run / "checkpoints" / str(STEPS)).is_dir()
    rates = {metrics(tmp_path / run)[0]["learning_rate"] for run in RUNS}
    assert len(rates) == 2  # each point's own schedule
    records = [json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["done"] * 4
