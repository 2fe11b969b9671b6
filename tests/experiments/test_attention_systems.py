"""The attention-systems sweep runs end to end on a tiny setting and skips what it has."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "attention_systems.py"
TINY = [
    "train.steps=2",
    "optim.warmup_steps=1",
    "train.eval_every=2",
    "data.batch_size=8",
    "data.eval_examples=8",
]


def sweep(results, *more):
    cmd = [sys.executable, str(SCRIPT), "--only", "reverse", "--results", str(results)]
    cmd += [f"--extra={o}" for o in TINY] + list(more)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_sweep_runs_stores_results_and_reruns_only_what_is_missing(tmp_path):
    first = sweep(tmp_path, "--variants", "softmax,linear_elu")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.count("training reverse") == 2
    for variant in ("softmax", "linear_elu"):
        record = json.loads((tmp_path / f"reverse-{variant}.json").read_text())
        assert record["step"] == 2 and 0.0 <= record["exact_match"] <= 1.0
        assert record["params"] == 110_336 and record["wall_sec"] > 0
    assert "| `reverse` | linear_elu | 110,336 | exact-match" in first.stdout
    again = sweep(tmp_path, "--variants", "softmax,linear_elu")
    assert again.returncode == 0 and "training" not in again.stdout  # nothing missing
    bad = sweep(tmp_path, "--variants", "softmax,flash")
    assert bad.returncode == 2 and "unknown variant 'flash'" in bad.stderr
