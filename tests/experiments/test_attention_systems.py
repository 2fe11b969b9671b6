"""The attention-systems sweep runs end to end on a tiny setting and skips what it has; every
system of the study is a valid config on every task."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
import attention_systems  # noqa: E402
from attention_systems import TASKS, VARIANTS  # noqa: E402
from sweep import config_hash  # noqa: E402

from tfmjax.config import load  # noqa: E402


def sweep(run_script, results, *more):
    return run_script("attention_systems", results, "--only", "reverse", "--seeds", "0", *more)


@pytest.mark.slow
def test_sweep_runs_stores_results_and_reruns_only_what_is_missing(run_script, tmp_path):
    first = sweep(run_script, tmp_path, "--variants", "softmax,linear_elu")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.count("training reverse") == 2
    for variant in ("softmax", "linear_elu"):
        record = json.loads((tmp_path / f"reverse-{variant}-seed0.json").read_text())
        assert record["step"] == 2 and 0.0 <= record["exact_match"] <= 1.0
        assert record["params"] == 110_336 and record["wall_sec"] > 0
    assert "| `reverse` | linear_elu | 110,336 | 1 | exact-match" in first.stdout
    again = sweep(run_script, tmp_path, "--variants", "softmax,linear_elu")
    assert again.returncode == 0 and "training" not in again.stdout  # nothing missing
    bad = sweep(run_script, tmp_path, "--variants", "softmax,flash")
    assert bad.returncode == 2 and "unknown variant 'flash'" in bad.stderr


def test_a_zero_budget_trains_nothing_and_still_tabulates(run_script, tmp_path):
    """``--budget 0`` starts no run (``--budget 0 --table`` rewrites the table only)."""
    done = sweep(run_script, tmp_path, "--variants", "softmax", "--budget", "0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "training" not in done.stdout and "time budget spent" in done.stdout
    assert "| `reverse` | softmax |" in done.stdout and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_system_is_a_valid_config_of_every_task(task, variant):
    """A run of the study that its config would refuse fails only after hours of others."""
    overrides = VARIANTS[variant][task]
    experiment = load(ROOT / attention_systems.config_of(task, variant), overrides)
    for override in overrides:  # each reached the model as written
        key, value = override.split("=")
        section, field = key.split(".")
        assert str(getattr(getattr(experiment, section), field)) == value, override


def test_table_and_figure_aggregate_the_seeds_and_ignore_stale_results(tmp_path, monkeypatch):
    """Mean and range over the current seeds; a diverged seed counted apart; a result of
    another config (a stale hash) left out; the figure is a PNG."""
    monkeypatch.setattr(attention_systems, "RESULTS", tmp_path)

    def record(seed, exact_match=None, diverged_at=None, stale=False):
        overrides = attention_systems.overrides_of("reverse", "mla", seed, [])
        digest = "0" * 16 if stale else config_hash(TASKS["reverse"], overrides)
        body = {
            "config_hash": digest,
            "params": 110_380,
            "step": 1500,
            "wall_sec": 10.0 * (seed + 1),
        }
        body |= {"diverged_at": diverged_at, "exact_match": exact_match}
        path = attention_systems.result_path("reverse", "mla", seed)
        path.write_text(json.dumps(body))

    record(0, exact_match=1.0)
    record(1, exact_match=0.5)
    record(2, diverged_at=700)
    record(3, exact_match=0.0, stale=True)
    text = attention_systems.table(["reverse"], ["mla", "softmax"], (0, 1, 2, 3))
    row = next(line for line in text.splitlines() if "| mla |" in line)
    assert "| 110,380 | 3 |" in row  # the stale seed 3 is not counted
    assert "exact-match 0.750 (0.500-1.000) at step 1500" in row
    assert "1 diverged (non-finite loss; step 700)" in row and "| 20 s |" in row
    assert "| `reverse` | softmax | | 0 | not run | |" in text
    png = tmp_path / "systems.png"
    attention_systems.figure(["reverse"], ["mla", "softmax"], (0, 1, 2, 3), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
