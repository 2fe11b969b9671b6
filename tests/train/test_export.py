"""The whole jitted train step, ``jax.export``-ed for ``cuda`` and for ``tpu`` from this CPU host.

For one tiny model per family (encoder-decoder and decoder-only, GQA, dropout on), attention
``auto`` and ``pallas`` in float32 and bfloat16 compute (and ``cudnn``, bfloat16 on cuda), the
exported module of the real step (:func:`tfmjax.train.step.make_train_step`, abstract state
from :func:`tfmjax.train.state.abstract_state`, a task batch as ShapeDtypeStructs) holds:

* the platform's attention kernels, forward and backward: Triton calls on cuda, Mosaic
  ``tpu_custom_call`` on tpu (each of the ``tfmjax_flash_fwd/dq/dkv`` kernels), cuDNN's
  ``__cudnn$fmhaSoftmax`` and ``...Backward`` for cudnn; no other custom call. The export
  lifts its safety check only for those kernels (Triton and cuDNN are off jax's list of
  stable targets), so any other unstable call would already fail it;
* no host callback (``xla_python_*_callback``, ``xla_ffi_python_*``) and no Pallas
  interpreter loop (a ``while`` in a ``tfmjax_flash_*`` scope: the cpu export is the positive
  control);
* with bfloat16 compute, matmuls (``dot_general``) of bfloat16 operands only; with float32,
  of float32. Row-wise dot products (no free dimension: the Pallas backward's
  ``delta = rowsum(dO * O)``, kept in float32 on purpose) are reductions, not matmuls;
* parameters and optimizer state float32 in the step's inputs and outputs, whatever the
  compute dtype.

Nothing here runs the step: these are lowerings (no device compiler).
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import jax
import jax.numpy as jnp
import pytest
from jax import export

from tfmjax.compat import gpu_lowering_target
from tfmjax.config import ModelConfig
from tfmjax.data import make_batch, make_task
from tfmjax.models import build
from tfmjax.train.optimizer import make_optimizer
from tfmjax.train.state import abstract_state
from tfmjax.train.step import jit_train_step, make_train_step

TRITON, MOSAIC = "__gpu$xla.gpu.triton", "tpu_custom_call"
CUDNN = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")
KERNEL_TARGETS = {
    ("pallas", "cuda"): {TRITON},
    ("pallas", "tpu"): {MOSAIC},
    ("auto", "cuda"): {TRITON},  # AUTO_TABLE: Pallas on GPU and TPU today
    ("auto", "tpu"): {MOSAIC},
    ("cudnn", "cuda"): set(CUDNN),
}
PALLAS_KERNELS = {"tfmjax_flash_fwd", "tfmjax_flash_dq", "tfmjax_flash_dkv"}
HOST_CALLBACK = re.compile(r"callback|python", re.IGNORECASE)
INTERPRETED = re.compile(r"tfmjax_flash_(fwd|dq|dkv)/while")
DTYPE_SUFFIX = {"float32": "f32", "bfloat16": "bf16"}

# One xdist worker for the file: the cuda and tpu exports of a model share its trace.
pytestmark = pytest.mark.xdist_group("train_export")

TASK = make_task("reverse", max_len=12, num_symbols=8)
CASES = [
    (family, impl, dtype, platform)
    for family in ("encoder_decoder", "decoder_only")
    for impl in ("auto", "pallas", "cudnn")
    for dtype in ("float32", "bfloat16")
    for platform in ("cuda", "tpu")
    if impl != "cudnn" or (dtype, platform) == ("bfloat16", "cuda")
]


def _config(family: str, impl: str, dtype: str) -> ModelConfig:
    return ModelConfig(
        family=family,
        vocab_size=TASK.vocab.size,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        d_ff=64,
        num_layers=1,
        max_len=32,
        dropout_rate=0.1,
        attention_impl=impl,
        dtype=dtype,
    )


def _batch(model) -> dict:
    return make_batch(TASK, batch_format=model.batch_format, batch_size=2, seed=0, step=0)


@functools.cache
def _step(family: str, impl: str, dtype: str):
    """The jitted train step (Adam with clipping, constant rate), its abstract state and the
    batch specs (2 task rows); one per model, so both platforms' exports share its trace."""
    cfg = _config(family, impl, dtype)
    model = build(cfg)
    tx = make_optimizer(schedule=1e-3)
    batch = _batch(model)
    state = abstract_state(model, tx, batch, seed=0)
    step = jit_train_step(make_train_step(build(cfg, deterministic=False), tx, lambda s: 1e-3))
    return step, state, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)


def _export(family: str, impl: str, dtype: str, platform: str) -> export.Exported:
    step, state, specs = _step(family, impl, dtype)
    unstable = [export.DisabledSafetyCheck.custom_call(t) for t in (TRITON, *CUDNN)]
    with gpu_lowering_target():
        return export.export(step, platforms=(platform,), disabled_checks=unstable)(state, specs)


def _custom_calls(text: str) -> Counter:
    return Counter(re.findall(r"custom_call @([\w$.]+)\(", text))


def _matmul_operand_dtypes(text: str) -> Counter:
    """``(lhs, rhs)`` element types of every ``dot_general`` with a free dimension."""
    found = Counter()
    pattern = (
        r"stablehlo\.dot_general [^\n]*?(?:batching_dims = \[([\d, ]*)\][^\n]*?)?"
        r": \(tensor<(?:\d+x)*(\w+)>, tensor<(?:\d+x)*(\w+)>\) -> tensor<([^>]*)>"
    )
    for batch_dims, lhs, rhs, result in re.findall(pattern, text):
        batch = len(batch_dims.split(",")) if batch_dims.strip() else 0
        if len(result.split("x")) - 1 > batch:  # the result has a free (M or N) dimension
            found[lhs, rhs] += 1
    return found


def _state_dtypes(state) -> dict[str, set]:
    """The element types of the params and of the optimizer state's float leaves."""
    floats = lambda tree: {  # noqa: E731
        str(a.dtype) for a in jax.tree.leaves(tree) if jnp.issubdtype(a.dtype, jnp.floating)
    }
    return {"params": floats(state.params), "opt_state": floats(state.opt_state)}


@pytest.mark.parametrize("family, impl, dtype, platform", CASES, ids=["-".join(c) for c in CASES])
def test_train_step_exports_with_the_platforms_kernels(family, impl, dtype, platform):
    exported = _export(family, impl, dtype, platform)
    text = exported.mlir_module()
    assert exported.platforms == (platform,)

    calls = _custom_calls(text)
    assert not [t for t in calls if HOST_CALLBACK.search(t)], f"host callback in {calls}"
    assert set(calls) == KERNEL_TARGETS[impl, platform], calls
    if impl == "cudnn":  # one forward and one backward per attention
        assert calls[CUDNN[0]] == calls[CUDNN[1]] > 0
    else:  # forward, dQ and dK/dV kernels, never interpreted
        assert set(re.findall(r"tfmjax_flash_[a-z]+", text)) == PALLAS_KERNELS
    assert not INTERPRETED.search(text)

    suffix = DTYPE_SUFFIX[dtype]
    dots = _matmul_operand_dtypes(text)
    assert dots and set(dots) == {(suffix, suffix)}, f"{dtype} compute: matmuls {dict(dots)}"

    (state, batch), _ = jax.tree.unflatten(exported.in_tree, exported.in_avals)
    new_state, metrics = jax.tree.unflatten(exported.out_tree, exported.out_avals)
    assert (
        _state_dtypes(state)
        == _state_dtypes(new_state)
        == {
            "params": {"float32"},
            "opt_state": {"float32"},
        }
    )
    assert jax.tree.structure(state) == jax.tree.structure(new_state)
    want = _batch(build(_config(family, impl, dtype)))
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: (v.shape, v.dtype) for k, v in want.items()
    }
    assert metrics["loss"].shape == ()


def test_cpu_export_shows_the_interpreter():
    """Positive control for :data:`INTERPRETED` on an exported module (its debug locations
    carry the kernels' scopes): on cpu the Pallas kernels are interpreted, no device call."""
    exported = _export("decoder_only", "pallas", "float32", "cpu")
    text = exported.mlir_module()
    assert {m.group(1) for m in INTERPRETED.finditer(text)} == {"fwd", "dq", "dkv"}
    assert not _custom_calls(text)
