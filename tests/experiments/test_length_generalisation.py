"""The length-generalisation study runs end to end on a tiny setting: one JSON per run with
a score at each test length, a table and a PNG, and nothing retrained on a second call."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "length_generalisation",
    Path(__file__).resolve().parents[2] / "experiments" / "length_generalisation.py",
)
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


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


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_abacus_on_copy_and_reverse_trains_the_places_of_a_4x_test(task):
    """The 10 symbols are the digits; the offsets carry 8 training places to the 32 of a 4x
    test; ``abacus_end`` (the encoder counting from a number's end) is the encoder-decoder's
    on reverse only, where it lines each source symbol up with its answer symbol."""
    for family in study.FAMILIES:
        values = dict(o.split("=", 1) for o in study.overrides(task, family, "abacus", 0, []))
        assert values["model.position"] == "abacus" and values["model.digit_first_id"] == "5"
        assert 8 + int(values["model.abacus_max_offset"]) - 1 >= 32
        assert int(values["train.steps"]) > 1500 and "model.abacus_count_from" not in values
    end = dict(
        o.split("=", 1) for o in study.overrides(task, "encoder_decoder", "abacus_end", 0, [])
    )
    assert end["model.abacus_count_from"] == "end"
    assert study.applies(task, "encoder_decoder", "abacus_end") is (task == "reverse")
    assert not study.applies(task, "decoder_only", "abacus_end")
    assert study.applies(task, "decoder_only", "abacus")
    # FIRE trains as long as Abacus there; the ordered encodings keep the task's budget.
    steps = {
        e: dict(o.split("=", 1) for o in study.overrides(task, "decoder_only", e, 0, []))
        for e in ("fire", "abacus", "rope")
    }
    assert steps["fire"]["train.steps"] == steps["abacus"]["train.steps"]
    assert "train.steps" not in steps["rope"]


def test_every_run_of_the_study_is_a_valid_config():
    """Each (task, family, encoding) loads with its overrides (randomized Abacus included:
    its places spread over the rows of the offsets, so it takes no ``max_position``)."""
    from tfmjax.config import load

    for task, family, encoding, seed in study.runs(
        study.TASKS, study.FAMILIES, study.ENCODINGS, [0]
    ):
        exp = load(
            study.ROOT / study.config_of(task, family),
            study.overrides(task, family, encoding, seed, []),
        )
        assert exp.model.position_sampling == (
            "randomized" if "randomized" in encoding else "ordered"
        )


def test_an_encoding_keeps_its_colour_in_every_panel_and_a_randomized_one_is_dashed():
    """Panels draw different subsets of the encodings (no "none" in an encoder-decoder,
    "abacus_end" in one panel): colours must not follow the drawing order, as they once did
    (the encoder-decoder's FIRE line took the colour the legend gave "none")."""
    styles = {e: study.line_style(e) for e in study.ENCODINGS}
    ordered = [e for e in study.ENCODINGS if not e.startswith("randomized_")]
    assert len({styles[e]["color"] for e in ordered}) == len(ordered)
    for encoding, style in styles.items():
        base = encoding.removeprefix("randomized_")
        assert style["label"] == encoding and style["color"] == styles[base]["color"]
        assert style.get("linestyle", "-") == ("--" if base != encoding else "-")
