"""Bit-exact resume: a run stopped (SIGTERM mid-window) and crashed (past its last checkpoint),
then resumed, ends with the same params and the same metrics records as a straight run."""

import os
import signal

import pytest

from tfmjax.checkpoint import load_for_inference, params_hash
from tfmjax.config import from_dict
from tfmjax.train.loop import train
from tfmjax.train.metrics_log import deterministic_part, read_records

STEPS = 12


def experiment(family: str, workdir) -> object:
    return from_dict(
        {
            "model": {
                "family": family,
                "vocab_size": 16,
                "d_model": 16,
                "num_heads": 2,
                "d_ff": 32,
                "num_layers": 1,
                "dropout_rate": 0.1,
                "tie_embeddings": False,
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


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_stop_crash_resume_is_bit_exact(tmp_path, family):
    straight = experiment(family, tmp_path / "straight")
    result = run(straight)
    assert result["step"] == STEPS and not result["stopped"]

    broken = experiment(family, tmp_path / "broken")
    first = run(broken, on_step=sigterm_at(5))  # mid log window (3 | 6), not a checkpoint step
    assert first == {**first, "step": 5, "stopped": True}
    with pytest.raises(Crash):  # dies after step 10: newest checkpoint is 8
        run(broken, on_step=crash_at(10))
    assert max(r["step"] for r in read_records(tmp_path / "broken" / "metrics.jsonl")) == 9
    assert run(broken)["step"] == STEPS  # resumes from 8, rewrites 9

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
