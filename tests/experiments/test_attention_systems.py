"""The attention-systems sweep runs end to end on a tiny setting and skips what it has; every
system of the study is a valid config on every task."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from attention_systems import TASKS, VARIANTS  # noqa: E402

from tfmjax.config import load  # noqa: E402


def sweep(run_script, results, *more):
    return run_script("attention_systems", results, "--only", "reverse", *more)


@pytest.mark.slow
def test_sweep_runs_stores_results_and_reruns_only_what_is_missing(run_script, tmp_path):
    first = sweep(run_script, tmp_path, "--variants", "softmax,linear_elu")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.count("training reverse") == 2
    for variant in ("softmax", "linear_elu"):
        record = json.loads((tmp_path / f"reverse-{variant}.json").read_text())
        assert record["step"] == 2 and 0.0 <= record["exact_match"] <= 1.0
        assert record["params"] == 110_336 and record["wall_sec"] > 0
    assert "| `reverse` | linear_elu | 110,336 | exact-match" in first.stdout
    again = sweep(run_script, tmp_path, "--variants", "softmax,linear_elu")
    assert again.returncode == 0 and "training" not in again.stdout  # nothing missing
    bad = sweep(run_script, tmp_path, "--variants", "softmax,flash")
    assert bad.returncode == 2 and "unknown variant 'flash'" in bad.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_system_is_a_valid_config_of_every_task(task, variant):
    """A run of the study that its config would refuse fails only after hours of others."""
    overrides = VARIANTS[variant][task]
    experiment = load(ROOT / TASKS[task], overrides)
    for override in overrides:  # each reached the model as written
        key, value = override.split("=")
        section, field = key.split(".")
        assert str(getattr(getattr(experiment, section), field)) == value, override
