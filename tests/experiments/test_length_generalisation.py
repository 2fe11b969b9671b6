"""The length-generalisation study runs end to end on a tiny setting: one JSON per run with
a score at each test length, a table and a PNG, and nothing retrained on a second call."""

import json

import pytest


@pytest.mark.slow
def test_study_scores_each_length_and_reruns_only_what_is_missing(run_script, tmp_path):
    args = ["--only", "addition_reversed", "--families", "decoder_only", "--seeds", "0"]
    args += ["--encodings", "none,abacus", "--figure", str(tmp_path / "len.png")]
    first = run_script("length_generalisation", tmp_path, *args)
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads((tmp_path / "addition_reversed-decoder_only-none-seed0.json").read_text())
    assert [p["length"] for p in record["scores"]] == [4, 6, 8, 16]
    for point in record["scores"]:
        assert 0.0 <= point["exact_match"] <= 1.0 and 0.0 <= point["token_accuracy"] <= 1.0
    assert "model.position=none" in record["train"]["overrides"]
    abacus = json.loads((tmp_path / "addition_reversed-decoder_only-abacus-seed0.json").read_text())
    assert "model.digit_first_id=5" in abacus["train"]["overrides"]
    offset = [o for o in abacus["train"]["overrides"] if o.startswith("model.abacus_max_offset=")]
    # training numbers have up to 5 places (a 4-digit sum): the offsets, below the bound,
    # must carry them to the 17 places of a sum of two 16-digit operands (4x)
    assert len(offset) == 1 and 5 + int(offset[0].split("=")[1]) - 1 >= 17
    assert "| `addition_reversed` | decoder_only | none | 1 |" in first.stdout
    assert (tmp_path / "len.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run_script("length_generalisation", tmp_path, *args)
    assert again.returncode == 0 and "training" not in again.stdout
    bad = run_script("length_generalisation", tmp_path, "--encodings", "xpos")
    assert bad.returncode == 2 and "unknown encoding 'xpos'" in bad.stderr
