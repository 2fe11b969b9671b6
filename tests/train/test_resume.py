"""Bit-exact resume: a run stopped (SIGTERM mid-window) and crashed (past its last checkpoint),
then resumed, ends with the same params and the same metrics records as a straight run."""

import io
import logging
import os
import signal

import pytest

from tfmjax.checkpoint import load_for_inference, params_hash
from tfmjax.config import from_dict
from tfmjax.reporting.metrics_log import deterministic_part, read_records
from tfmjax.train.loop import train

STEPS = 12


# A mixture of experts (top-2 of 4, a capacity that drops) resumes bit-exact too: its log
# window carries the router metrics' sums.
MOE = {"moe_experts": 4, "moe_top_k": 2, "moe_capacity_factor": 1.0}


def experiment(family: str, workdir, **model) -> object:
    return from_dict(
        {
            "model": {
                **model,
                "family": family,
                "vocab_size": 16,
                "d_model": 16,
                "num_heads": 2,
                "d_ff": 32,
                "num_layers": 1,
                "dropout_rate": 0.1,
                "tie_embeddings": False,
                **model,
            },
            "optim": {"learning_rate": 3e-3, "warmup_steps": 2},
            "data": {
                "task": "reverse",
                "task_params": {"num_symbols": 5, "max_len": 5},
                "batch_size": 8,
                "eval_examples": 8,
            },
            "train": {
                "steps": STEPS,
                "log_every": 3,
                "eval_every": 6,
                "checkpoint_every": 4,
                "workdir": str(workdir),
            },
        },
        name=f"resume_{family}",
    )


class Crash(Exception):
    pass


def sigterm_at(step):
    def hook(done):
        if done == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def crash_at(step):
    def hook(done):
        if done == step:
            raise Crash

    return hook


def run(exp, **kw):
    return train(exp, progress=False, plot=False, stream=open(os.devnull, "w"), **kw)


def run_recording(exp, **kw):
    """``run``, plus the console text and every step this call ran (``on_step`` sees them)."""
    steps, out = [], io.StringIO()
    hook = kw.pop("on_step", None)

    def on_step(done):
        steps.append(done)
        if hook is not None:
            hook(done)

    result = train(exp, progress=False, plot=False, stream=out, on_step=on_step, **kw)
    return result, steps, out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, model",
    [
        ("encoder_decoder", {}),
        ("decoder_only", {}),
        ("decoder_only", MOE),
        # positions drawn from the step's dropout key (Ruoss et al. 2023): the same on resume
        ("decoder_only", {"position_sampling": "randomized", "max_len": 16, "max_position": 64}),
    ],
    ids=["encoder_decoder", "decoder_only", "decoder_only_moe", "decoder_only-randomized"],
)
def test_stop_crash_resume_is_bit_exact(tmp_path, family, model):
    """SIGTERM at 5, a crash after 10, a rerun: each run starts where it must (6, then 9 from
    checkpoint 8) and the end is bit-identical to a straight run, params and records."""
    straight = experiment(family, tmp_path / "straight", **model)
    result = run(straight)
    assert result["step"] == STEPS and not result["stopped"]

    broken = experiment(family, tmp_path / "broken", **model)
    first, steps, _ = run_recording(broken, on_step=sigterm_at(5))  # mid log window (3 | 6)
    assert first == {**first, "step": 5, "stopped": True} and steps == [1, 2, 3, 4, 5]
    crashed = []  # the steps the second run ran: it resumed from 5, the SIGTERM save
    with pytest.raises(Crash):  # dies after step 10: newest checkpoint is 8
        run(broken, on_step=lambda done: (crashed.append(done), crash_at(10)(done)))
    assert crashed == [6, 7, 8, 9, 10]
    assert max(r["step"] for r in read_records(tmp_path / "broken" / "metrics.jsonl")) == 9
    last, steps, out = run_recording(broken)
    assert last["step"] == STEPS
    # resumed from 8 (the newest checkpoint), not from 5 or 4: steps 9..12 ran, 9 again
    assert steps == [9, 10, 11, 12]
    assert "resumed from checkpoint step 8" in out

    _, params_a, _ = load_for_inference(tmp_path / "straight")
    _, params_b, _ = load_for_inference(tmp_path / "broken")
    assert params_hash(params_a) == params_hash(params_b)
    records_a = [
        deterministic_part(r) for r in read_records(tmp_path / "straight" / "metrics.jsonl")
    ]
    records_b = [deterministic_part(r) for r in read_records(tmp_path / "broken" / "metrics.jsonl")]
    assert records_a == records_b
    assert [r["step"] for r in records_a if r["split"] == "train"] == [3, 6, 9, 12]
    assert [r["step"] for r in records_a if r["split"] == "eval"] == [6, 12]
    if model is MOE:  # the mixture's router metrics travel through the resume too
        assert all("moe_aux_loss" in r for r in records_a if r["split"] == "train")


def _corrupt_arrays(step_dir):
    """Flip bytes all through the biggest file of a checkpoint's state (its array data)."""
    files = [f for f in (step_dir / "state").rglob("*") if f.is_file()]
    biggest = max(files, key=lambda f: f.stat().st_size)
    data = bytearray(biggest.read_bytes())
    for i in range(len(data) // 4, len(data), max(len(data) // 64, 1)):
        data[i] ^= 0xFF
    biggest.write_bytes(bytes(data))


@pytest.mark.slow
def test_corrupt_newest_checkpoint_falls_back_and_cuts_metrics_back(tmp_path, caplog):
    """train() on a workdir whose newest checkpoint (8) is corrupt: one warning line, resume
    from step 4, metrics.jsonl cut back to step 4 (the records of 6 and 9 rewritten, not
    doubled), and the run still ends bit-identical to a straight one."""
    straight = experiment("decoder_only", tmp_path / "straight")
    run(straight)
    broken = experiment("decoder_only", tmp_path / "broken")
    with pytest.raises(Crash):  # after step 10: checkpoints 4 and 8, records up to 9
        run(broken, on_step=crash_at(10))
    assert [r["step"] for r in read_records(tmp_path / "broken" / "metrics.jsonl")] == [
        3,
        6,
        6,
        9,
    ]
    _corrupt_arrays(tmp_path / "broken" / "checkpoints" / "8")
    with caplog.at_level(logging.WARNING, logger="tfmjax.checkpoint"):
        result, steps, out = run_recording(broken)
    assert result["step"] == STEPS and steps == [5, 6, 7, 8, 9, 10, 11, 12]
    assert "resumed from checkpoint step 4" in out
    warnings = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("checkpoint step 8 is corrupt")
    assert warnings[0].endswith("falling back to step 4")

    records_a = [
        deterministic_part(r) for r in read_records(tmp_path / "straight" / "metrics.jsonl")
    ]
    records_b = [deterministic_part(r) for r in read_records(tmp_path / "broken" / "metrics.jsonl")]
    assert records_b == records_a
    _, params_a, _ = load_for_inference(tmp_path / "straight")
    _, params_b, _ = load_for_inference(tmp_path / "broken")
    assert params_hash(params_a) == params_hash(params_b)
