"""The task-seeds sweep runs end to end on a tiny setting, stores one JSON per run, reruns
only what is missing, and tabulates mean and range over the seeds."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from sweep import config_hash, is_current  # noqa: E402


def sweep(run_script, results, *more):
    return run_script("tasks", results, "--only", "copy_decoder", *more)


@pytest.mark.slow
def test_sweep_stores_each_seed_and_reruns_only_what_is_missing(run_script, tmp_path):
    first = sweep(run_script, tmp_path, "--seeds", "0")
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads((tmp_path / "copy_decoder-seed0.json").read_text())
    assert record["seed"] == 0 and record["step"] == 2 and "train.seed=0" in record["overrides"]
    assert 0.0 <= record["exact_match"] <= 1.0 and record["wall_sec"] > 0
    assert "| `copy_decoder` | 1 | 2 |" in first.stdout
    # The run trained in the sweep's way, in its own workdir under RESULTS/runs; a run whose
    # last step is saved there is not trained again: its lost result is read back from it.
    workdirs = list((tmp_path / "runs" / "tasks").glob("copy_decoder-seed0-*"))
    assert len(workdirs) == 1 and (workdirs[0] / "train.log").is_file()
    (tmp_path / "copy_decoder-seed0.json").unlink()
    reread = sweep(run_script, tmp_path, "--seeds", "0")
    assert reread.returncode == 0 and "training" not in reread.stdout, reread.stderr[-2000:]
    reread_record = json.loads((tmp_path / "copy_decoder-seed0.json").read_text())
    assert reread_record["curve"] == record["curve"]
    # Seed 1's result is written by hand with its config's hash: it is kept, not retrained,
    # and the table shows the mean and range of the two.
    overrides = ["train.seed=1", *record["overrides"][1:]]
    fake = dict(record, seed=1, exact_match=0.25, wall_sec=1.0, overrides=overrides)
    fake["config_hash"] = config_hash("configs/copy_decoder.toml", overrides)
    (tmp_path / "copy_decoder-seed1.json").write_text(json.dumps(fake))
    again = sweep(run_script, tmp_path, "--seeds", "0,1")
    assert again.returncode == 0 and "training" not in again.stdout, again.stderr[-2000:]
    low, high = sorted([record["exact_match"], 0.25])
    mean = (low + high) / 2
    assert f"| `copy_decoder` | 2 | 2 | {mean:.3f} ({low:.3f}-{high:.3f}) |" in again.stdout
    # A changed config is stale: its stored result is not its own.
    path = tmp_path / "copy_decoder-seed0.json"
    assert is_current(path, "configs/copy_decoder.toml", record["overrides"])
    assert not is_current(
        path, "configs/copy_decoder.toml", [*record["overrides"], "train.steps=3"]
    )
