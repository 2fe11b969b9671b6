"""Run an experiment script on a tiny setting: two training steps, eight examples."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "train.steps=2",
    "optim.warmup_steps=1",
    "train.eval_every=2",
    "data.batch_size=8",
    "data.eval_examples=8",
]


@pytest.fixture(scope="session")
def tiny_overrides():
    """The overrides that make any run tiny (two steps, eight examples)."""
    return list(TINY)


@pytest.fixture(scope="session")
def run_script():
    """``run_script(name, results_dir, *args)``: ``experiments/NAME.py`` with the tiny
    overrides for every run and results under ``results_dir`` (the runs' workdirs too, in
    ``results_dir/runs``); the CompletedProcess."""

    def run(name, results, *args):
        cmd = [sys.executable, str(ROOT / "experiments" / f"{name}.py"), "--results", str(results)]
        cmd += [f"--extra={o}" for o in TINY] + list(args)
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)

    return run
