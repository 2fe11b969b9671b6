"""``auto`` picks cuDNN on cuda only where it is correct and measured to pay
(:data:`tfmjax.kernels.AUTO_TABLE`): from length 1024, for calls whose segment ids are
absent or promised in cuDNN's form (one segment, then padding: traced inside
:func:`tfmjax.kernels.trailing_padding`, as the training and evaluation steps are, whose
batches the host checks), at ``q_offset = 0``, with masks cuDNN takes. Everything else
(packed or left-padded batches, generation, ALiBi, float32, shorter calls) keeps Pallas.
Checked by lowering for cuda on this CPU host and counting each kernel's custom calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import compat, kernels
from tfmjax.config import ModelConfig
from tfmjax.kernels import masks
from tfmjax.kernels.testing import call_kwargs, random_inputs, segment_ids
from tfmjax.models import build
from tfmjax.models.checks import InputError, auto_may_run_cudnn, this_platform
from tfmjax.train.kernel_note import attention_note

CUDNN = "__cudnn$fmhaSoftmax"
TRITON = compat.triton_custom_call_target()


def _kernels_of(fn, *args) -> dict:
    with compat.gpu_lowering_target():
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return {"cudnn": text.count(f"@{CUDNN}("), "triton": text.count(f"@{TRITON}(")}


def _padded(T, dtype=jnp.bfloat16, **options):
    """A right-padded batch of two rows: ``(fn(q, k, v), q, k, v)`` of ``auto``."""
    q, k, v, _ = random_inputs(2, T, T, 4, 2, 64, dtype)
    ids = segment_ids(T, [[(1, T - 7), (0, 7)], [(1, T)]])
    kw = call_kwargs(64, causal=True, q_segment_ids=ids, kv_segment_ids=ids, **options)
    return (lambda q, k, v: kernels.attention(q, k, v, **kw)), q, k, v


def test_the_table_names_cudnn_from_1024_on_cuda_only():
    choose = kernels.choose_impl
    assert choose("auto", q_len=1024, kv_len=1024, backend="cuda", cudnn_ok=True) == "cudnn"
    assert choose("auto", q_len=1023, kv_len=4096, backend="cuda", cudnn_ok=True) == "pallas"
    assert choose("auto", q_len=4096, kv_len=4096, backend="cuda") == "pallas"  # not ok
    assert choose("auto", q_len=1, kv_len=4096, backend="cuda", cudnn_ok=True) == "xla"
    for platform in ("tpu", "rocm", "cpu"):
        assert choose("auto", q_len=4096, kv_len=4096, backend=platform, cudnn_ok=True) != ("cudnn")


def test_segment_ids_need_the_promise():
    fn, q, k, v = _padded(1024)
    assert _kernels_of(fn, q, k, v) == {"cudnn": 0, "triton": 1}
    promised = kernels.traced_with_trailing_padding(fn)
    assert _kernels_of(promised, q, k, v) == {"cudnn": 1, "triton": 0}
    with kernels.trailing_padding():  # the context itself, open while tracing
        assert _kernels_of(lambda *a: fn(*a), q, k, v) == {"cudnn": 1, "triton": 0}
    assert _kernels_of(lambda *a: fn(*a), q, k, v)["cudnn"] == 0  # closed again


def test_no_segment_ids_need_no_promise():
    q, k, v, _ = random_inputs(1, 1024, 1024, 4, 4, 64, jnp.bfloat16)
    fn = lambda q, k, v: kernels.attention(q, k, v, causal=True)  # noqa: E731
    assert _kernels_of(fn, q, k, v) == {"cudnn": 1, "triton": 0}


@pytest.mark.parametrize(
    "T, dtype, options, why",
    [
        (512, jnp.bfloat16, {}, "shorter than the cudnn row"),
        (1024, jnp.float32, {}, "cuDNN has no float32 kernel"),
        (1024, jnp.bfloat16, {"alibi_slopes": masks.alibi_slopes(4)}, "ALiBi"),
        (1024, jnp.bfloat16, {"q_offset": 16}, "a query block after a prefix"),
    ],
)
def test_what_cudnn_cannot_take_stays_on_pallas_under_the_promise(T, dtype, options, why):
    fn, q, k, v = _padded(T, dtype, **options)
    got = _kernels_of(kernels.traced_with_trailing_padding(fn), q, k, v)
    assert got == {"cudnn": 0, "triton": 1}, why


def test_a_decode_step_never_takes_cudnn():
    """A traced offset (the KV cache's index): xla for one row, Pallas for more."""
    q, k, v, _ = random_inputs(2, 8, 1024, 4, 2, 64, jnp.bfloat16)
    ids = jnp.ones((2, 1024), jnp.int32)

    def step(q, k, v, index):
        kw = call_kwargs(64, causal=True, q_segment_ids=ids[:, :8], kv_segment_ids=ids)
        return kernels.attention(q, k, v, **{**kw, "q_offset": index})

    promised = kernels.traced_with_trailing_padding(step)
    assert _kernels_of(promised, q, k, v, jnp.int32(100))["cudnn"] == 0


def _model(impl="auto", max_len=1024):
    cfg = ModelConfig(
        family="decoder_only", vocab_size=32, d_model=32, num_heads=4, d_ff=64, num_layers=1,
        max_len=max_len, dtype="bfloat16", attention_impl=impl, pad_id=0,
    )  # fmt: skip
    return build(cfg)


def test_check_batch_keeps_the_promise():
    """A left-padded row is refused, in one line saying what to set, only where a step may
    run cuDNN: ``auto`` when promised, and ``cudnn`` always."""
    left = {"tokens": np.array([[0, 0, 5, 6], [5, 6, 7, 8]], np.int32)}
    right = {"tokens": np.array([[5, 6, 0, 0], [5, 6, 7, 8]], np.int32)}
    auto = _model("auto")
    auto.check_batch(left)  # no promise: packed or left-padded batches are fine
    auto.check_batch(right, trailing_padding=True)
    with pytest.raises(InputError) as error:
        auto.check_batch(left, trailing_padding=True)
    message = str(error.value)
    assert "\n" not in message and "row 0 is [0, 0, 1, 1]" in message
    assert "'auto' may run cuDNN" in message and "'pallas' or 'xla'" in message
    _model("pallas").check_batch(left, trailing_padding=True)
    with pytest.raises(InputError, match="model.attention_impl='cudnn' masks .* 'pallas' or 'xla'"):
        _model("cudnn").check_batch(left)


def test_the_promise_is_made_on_cuda_for_auto_models_that_reach_the_cudnn_row():
    """Only where a step could take cuDNN: ``auto``, cuda (not rocm, whose jax backend is
    also "gpu"), and a ``max_len`` of at least the row's 1024, so a short model on a GPU
    has its batches checked for nothing it does not need."""
    cfg = _model().config
    assert auto_may_run_cudnn(cfg, "cuda")
    assert not any(auto_may_run_cudnn(cfg, p) for p in ("cpu", "rocm", "tpu"))
    assert not auto_may_run_cudnn(_model("pallas").config, "cuda")
    assert not auto_may_run_cudnn(_model(max_len=1023).config, "cuda")
    assert auto_may_run_cudnn(cfg) == (this_platform() == "cuda")


def test_other_gpus_and_wide_heads_keep_pallas():
    """cuDNN was measured on Hopper at head widths up to 128: an A100 (whose cuDNN takes at
    most 128) and a 256-wide head on an H100 stay on Pallas, promise or not."""
    fn, q, k, v = _padded(1024)
    promised = kernels.traced_with_trailing_padding(fn)
    with compat.gpu_lowering_target("NVIDIA A100-SXM4-80GB"):
        text = jax.jit(promised).trace(q, k, v).lower(lowering_platforms=("cuda",)).as_text()
    assert f"@{CUDNN}(" not in text and f"@{TRITON}(" in text
    wide = random_inputs(1, 1024, 1024, 2, 2, 256, jnp.bfloat16)[:3]
    attend = lambda q, k, v: kernels.attention(q, k, v, causal=True)  # noqa: E731
    assert _kernels_of(attend, *wide) == {"cudnn": 0, "triton": 1}


def test_the_run_header_says_what_attention_runs():
    cfg, h100 = _model().config, "NVIDIA H100 80GB HBM3"
    assert attention_note(cfg, (1024,), "cpu", "cpu") == ""
    assert attention_note(cfg, (1024,), "cuda", h100) == (
        "attention: cudnn ('auto' at length 1024 on cuda; tfmjax.kernels.AUTO_TABLE)"
    )
    short = attention_note(cfg, (256,), "cuda", h100)
    assert short.startswith("attention: pallas [triton kernels: TFMJAX_PALLAS_GPU=triton]")
    fp32 = attention_note(ModelConfig(**{**vars(cfg), "dtype": "float32"}), (1024,), "cuda", h100)
    assert "cuDNN is not taken for this model on NVIDIA H100" in fp32
    a100 = attention_note(cfg, (1024,), "cuda", "NVIDIA A100-SXM4-80GB")
    assert a100.startswith("attention: pallas") and "not taken" in a100
    assert attention_note(_model("xla").config, (1024,), "tpu", "TPU v5 lite") == (
        "attention: xla (model.attention_impl='xla')"
    )
    mla = ModelConfig(**{**vars(cfg), "attention": "mla"})
    assert attention_note(mla, (1024,), "cuda", h100) == ""  # not one call of the head width
    assert attention_note(cfg, (1024, 1024), "cuda", h100) == ""  # two stacks, cross attention
