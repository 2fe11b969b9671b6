"""Training a run longer never moves its learning rate silently.

A decaying schedule (cosine, linear, wsd) spans ``train.steps`` unless ``optim.schedule_steps``
says otherwise, so a resume with more steps would restretch it: a finished cosine run would
jump from its end rate back up its curve. Such a resume is refused in one line naming both
rates and the two choices; ``optim.schedule_steps`` = the old span keeps the schedule (the
rate of the resumed steps is the old schedule's, checked against the cosine formula), and
``--override-config`` takes the new span with the jump printed.
"""

import dataclasses
import io
import json
import math

import numpy as np
import pytest

from tfmjax.checkpoint import CheckpointError, load_config
from tfmjax.config import ConfigError, load
from tfmjax.reporting.metrics_log import read_records
from tfmjax.train.loop import train
from tfmjax.train.resume import check_resume, learning_rate, longer_hint
from tfmjax.train.run import make_run_schedule

CONFIG = "configs/reverse.toml"  # cosine, 3e-3 peak, 100 warmup steps


def cosine(step, peak, warmup, span, end=0.0):
    """Linear warmup to ``peak``, then ``end + (peak - end) (1 + cos(pi p)) / 2`` with ``p``
    the share of the span after warmup, ``end`` past it (Loshchilov & Hutter 2017, SGDR,
    one cycle)."""
    if step < warmup:
        return peak * step / warmup
    p = min((step - warmup) / (span - warmup), 1.0)
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * p))


def exp(*overrides):
    return load(CONFIG, ["train.steps=300", *overrides])


def test_a_finished_cosine_run_trained_longer_is_refused_with_the_choice():
    saved = exp().to_dict()
    with pytest.raises(CheckpointError) as err:
        check_resume(saved, exp("train.steps=600"), 300, override=False)
    message = str(err.value)
    new = cosine(300, 3e-3, 100, 600)
    assert "\n" not in message
    assert f"cosine learning rate there from 0 to {new:.3g}" in message
    assert "add optim.schedule_steps=300" in message and "--override-config" in message


def test_mid_run_too_and_a_shorter_run():
    saved = exp().to_dict()
    for steps in (600, 200):
        with pytest.raises(CheckpointError, match="add optim.schedule_steps=300"):
            check_resume(saved, exp(f"train.steps={steps}"), 150, override=False)
    # past both spans the rate is the end rate either way: nothing moves
    assert check_resume(saved, exp("train.steps=200"), 300, override=False) == [
        "train.steps 300 -> 200"
    ]


def test_keeping_the_span_keeps_every_rate():
    saved, kept = exp(), exp("train.steps=600", "optim.schedule_steps=300")
    assert check_resume(saved.to_dict(), kept, 300, override=False) == [
        "optim.schedule_steps 0 -> 300",
        "train.steps 300 -> 600",
    ]
    steps = np.arange(601)
    before = np.asarray(make_run_schedule(saved)(steps))
    after = np.asarray(make_run_schedule(kept)(steps))
    np.testing.assert_array_equal(after, before)
    reference = [cosine(s, 3e-3, 100, 300) for s in steps]
    np.testing.assert_allclose(after, reference, rtol=1e-5, atol=1e-9)


def test_schedules_whose_rate_does_not_move_resume_as_before():
    for schedule, step in (("wsd", 150), ("constant", 300), ("inverse_sqrt", 300)):
        saved = exp(f"optim.schedule={schedule!r}").to_dict()
        now = exp(f"optim.schedule={schedule!r}", "train.steps=600")
        assert check_resume(saved, now, step, override=False) == ["train.steps 300 -> 600"]
    assert longer_hint(exp("optim.schedule='constant'"), 300) == (
        "to train longer, rerun with train.steps=600"
    )


def test_override_applies_the_new_span_and_names_the_jump():
    new = cosine(300, 3e-3, 100, 600)
    changes = check_resume(exp().to_dict(), exp("train.steps=600"), 300, override=True)
    assert changes == [
        f"train.steps 300 -> 600 (the cosine learning rate at step 300: 0 -> {new:.3g})"
    ]
    assert learning_rate(exp("train.steps=600"), 300) == pytest.approx(new, rel=1e-5)


def test_other_refused_changes_keep_the_usual_refusal():
    with pytest.raises(CheckpointError, match="optim.learning_rate 0.003 -> 0.001") as err:
        check_resume(exp().to_dict(), exp("train.steps=600", "optim.learning_rate=1e-3"), 300,
                     override=False)  # fmt: skip
    assert "train.workdir=NEW_DIR" in str(err.value)


def test_the_finished_line_names_the_choice():
    hint = longer_hint(exp(), 300)
    new = cosine(300, 3e-3, 100, 600)
    assert hint == (
        "to train longer, rerun with train.steps=600 and either optim.schedule_steps=300 "
        "(keeps the cosine schedule: the rate stays at 0) or --override-config (stretches it "
        f"to 600 steps: the rate at step 300 goes from 0 to {new:.3g})"
    )


RAW = {
    "model": {
        "family": "decoder_only",
        "vocab_size": 16,
        "d_model": 16,
        "num_heads": 2,
        "d_ff": 32,
        "num_layers": 1,
    },
    "optim": {"learning_rate": 3e-3, "warmup_steps": 2},
    "data": {
        "task": "copy",
        "task_params": {"num_symbols": 5, "max_len": 4},
        "batch_size": 8,
        "eval_examples": 8,
    },
    "train": {"steps": 4, "log_every": 2, "eval_every": 4, "checkpoint_every": 2},
}  # fmt: skip  (test_resume_config's tiny run)


def _experiment(workdir, **train):
    from tfmjax.config import from_dict

    raw = json.loads(json.dumps(RAW))
    raw["optim"]["end_learning_rate"] = 1e-4  # a nonzero end: a rate to keep
    raw["train"].update(workdir=str(workdir), **train)
    return from_dict(raw, name="schedule")


def _run(experiment, **kw):
    out = io.StringIO()
    result = train(experiment, progress=False, plot=False, stream=out, **kw)
    return result, out.getvalue()


def _rates(workdir, after: int) -> dict[int, float]:
    records = read_records(workdir / "metrics.jsonl")
    return {
        r["step"]: r["learning_rate"]
        for r in records
        if r["split"] == "train" and r["step"] > after
    }


def test_training_longer_keeps_the_rate_or_says_how_it_moves(tmp_path):
    """A tiny run (cosine, peak 3e-3, 2 warmup steps, 4 steps) with
    an end rate of 1e-4: longer is refused and nothing is touched; with the span kept, the
    rate of every resumed step is the end rate; with --override-config, the stretched
    cosine's, and the printed change names the jump."""
    peak, end = RAW["optim"]["learning_rate"], 1e-4
    first = _experiment(tmp_path, log_every=1)
    _run(first)
    with pytest.raises(CheckpointError, match="optim.schedule_steps=4"):
        _run(_experiment(tmp_path, log_every=1, steps=8))
    assert load_config(tmp_path)["train"]["steps"] == 4

    kept = _experiment(tmp_path, log_every=1, steps=8)
    kept = dataclasses.replace(kept, optim=dataclasses.replace(kept.optim, schedule_steps=4))
    result, out = _run(kept)
    assert result["step"] == 8 and "optim.schedule_steps 0 -> 4, train.steps 4 -> 8" in out
    # the record of step s holds the rate step s used: the schedule at s - 1
    assert _rates(tmp_path, 3) == pytest.approx(
        {s: cosine(s - 1, peak, 2, 4, end) for s in range(4, 9)}, rel=1e-6
    )
    assert _rates(tmp_path, 4) == pytest.approx({s: end for s in range(5, 9)}, rel=1e-6)

    stretched = _experiment(tmp_path, log_every=1, steps=16)
    result, out = _run(stretched, override_config=True)
    jump = f"0.0001 -> {cosine(8, peak, 2, 16, end):.3g}"
    assert f"train.steps 8 -> 16 (the cosine learning rate at step 8: {jump})" in out
    assert _rates(tmp_path, 8) == pytest.approx(
        {s: cosine(s - 1, peak, 2, 16, end) for s in range(9, 17)}, rel=1e-6
    )


@pytest.mark.parametrize(
    "overrides, key, value",
    [
        (["train.steps=50"], "train.steps", 50),
        (["optim.schedule_steps=60"], "optim.schedule_steps", 60),
    ],
)
def test_a_span_shorter_than_the_warmup_is_refused_in_config_names(overrides, key, value):
    with pytest.raises(ConfigError) as err:
        make_run_schedule(exp(*overrides))
    assert str(err.value) == (
        f"{key}={value} is shorter than optim.warmup_steps=100, which optim.schedule='cosine' "
        f"finishes before it decays: set {key} >= 100 or optim.warmup_steps <= {value}"
    )
