"""The attention-systems sweep runs end to end on a tiny setting and skips what it has."""

import json

import pytest


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
