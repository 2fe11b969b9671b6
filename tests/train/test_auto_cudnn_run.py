"""The training step of a run promises cuDNN-form padding where it may run cuDNN (``auto``
on a CUDA GPU): lowered for cuda, a bf16 GPT on 1024-character windows then trains through
cuDNN's fused attention (its forward and backward calls, no Triton kernel); a run that makes no
promise (any CPU run, which this host can only pretend out of) keeps the Pallas kernels.
Pretending is a monkeypatch of the one decision, ``auto_may_run_cudnn``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import jax
import pytest

import tfmjax.train.run as run_module
from tfmjax.compat import gpu_lowering_target, triton_custom_call_target
from tfmjax.config import load
from tfmjax.data.sources import open_source
from tfmjax.models import build
from tfmjax.train.state import abstract_state

ROOT = Path(__file__).resolve().parents[2]
CUDNN = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")
SMALL = [
    "model.num_layers=2",
    "model.d_model=64",
    "model.num_heads=2",
    "model.d_ff=128",
    "model.dtype=bfloat16",
    "data.task_params.context=1024",
    "model.max_len=1024",
    "data.batch_size=2",
]


def _kernel_calls(promise: bool, monkeypatch) -> Counter:
    monkeypatch.setattr(run_module, "auto_may_run_cudnn", lambda cfg, platform=None: promise)
    experiment = load(ROOT / "configs" / "shakespeare_char.toml", SMALL)
    _, tx, step = run_module.make_training(experiment)
    model = build(experiment.model)
    batch = open_source(experiment.data.task, experiment.data.task_params).batch(
        batch_format=model.batch_format, batch_size=2, seed=0, step=0
    )
    state = abstract_state(model, tx, batch, seed=0)
    with gpu_lowering_target():
        text = jax.jit(step).trace(state, batch).lower(lowering_platforms=("cuda",)).as_text()
    targets = (*CUDNN, triton_custom_call_target())
    return Counter({t: text.count(f"@{t}(") for t in targets})


@pytest.mark.parametrize("promise", [True, False])
def test_the_promised_step_trains_through_cudnn(monkeypatch, promise):
    calls = _kernel_calls(promise, monkeypatch)
    if promise:  # cuDNN's forward and backward (in the scanned layers' bodies), no Triton
        assert calls[CUDNN[0]] > 0 and calls[CUDNN[1]] > 0
        assert calls[triton_custom_call_target()] == 0
    else:  # the forward, dQ and dK/dV Triton kernels of the scanned body, no cuDNN
        assert calls[CUDNN[0]] == calls[CUDNN[1]] == 0
        assert calls[triton_custom_call_target()] == 3
