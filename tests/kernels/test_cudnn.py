"""``attention_impl="cudnn"``: cuDNN's fused attention (tfmjax.kernels.cudnn_attention).

This CPU host has no GPU, so the cuDNN kernels never run here. What is checked:

* a model of each family, lowered for ``cuda`` from the CPU (forward and gradient), holds
  cuDNN's fused attention custom calls, one forward and one backward per attention, with
  the mask each attention needs (read from the calls' backend config): causal and padding,
  a causal window, GQA key/value heads, the scale;
* every option cuDNN cannot express is refused in one line, by the kernel and by the config;
* lowering (or running) ``cudnn`` for any other platform is a one-line ConfigError;
* KV-cached decoding (a traced ``q_offset``) runs the XLA path, and runs here;
* ``model.check_batch`` refuses batches whose padding cuDNN's per-row lengths cannot mask.

Numerics are compared with ``xla`` only by :func:`test_gpu_values_and_grads_match_xla`, which
needs a CUDA GPU and is skipped elsewhere.
"""

from __future__ import annotations

import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import compat, kernels
from tfmjax.config import ConfigError, ModelConfig
from tfmjax.kernels import cudnn_attention, dispatch, masks
from tfmjax.kernels.testing import call_kwargs, segment_ids
from tfmjax.models import build
from tfmjax.models.checks import InputError

FWD, BWD = "__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"
BF16 = jnp.bfloat16


def random_inputs(B, T, S, N, K, H, dtype, seed=0):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]``, ``d_out [B,T,N,H]`` from NumPy (jax.random would
    compile per shape: seconds on this CPU)."""
    rng = np.random.default_rng(seed)
    shapes = ((B, T, N, H), (B, S, K, H), (B, S, K, H), (B, T, N, H))
    return [jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for shape in shapes]


def _cudnn_calls(text: str) -> list[dict]:
    """``{"target", "mask_type", "window", "scale", "operands"}`` of each cuDNN call."""
    calls = []
    pattern = r"custom_call @(__cudnn\$\w+)\(([^)]*)\).*?backend_config = \"(.*?)\", "
    for target, operands, config in re.findall(pattern, text):
        fmha = json.loads(config.replace("\\22", '"'))["cudnn_fmha_backend_config"]
        calls.append(
            {
                "target": target,
                "mask_type": fmha["mask_type"],
                "window": fmha["sliding_window_length"],
                "scale": fmha["fmha_scale"],
                "operands": len(operands.split(",")),
            }
        )
    return calls


def _lowered(fn, *args, platform="cuda") -> str:
    with compat.gpu_lowering_target():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


# -- models of both families, lowered for cuda -------------------------------------------


def _config(family: str, impl: str = "cudnn", **kw) -> ModelConfig:
    base = dict(
        family=family,
        vocab_size=32,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        d_ff=64,
        num_layers=1,
        max_len=32,
        attention_impl=impl,
        dtype="bfloat16",
    )
    return ModelConfig(**{**base, **kw})


def _grad_fn(model):
    def loss(params, batch):
        return jnp.mean(model.apply(params, batch).astype(jnp.float32) ** 2)

    return jax.grad(loss)


@pytest.mark.parametrize(
    "family, overrides, want",
    [
        # decoder-only: causal self-attention over padded rows, RoPE, a causal window of 4
        ("decoder_only", {"position": "rope", "window": 4}, [("PADDING_CAUSAL", 5)]),
        # encoder self-attention, decoder causal self-attention, cross-attention
        (
            "encoder_decoder",
            {},
            [("PADDING", 0), ("PADDING_CAUSAL", 0), ("PADDING", 0)],
        ),
    ],
)
def test_model_lowers_to_cudnn_for_cuda(family, overrides, want):
    """Forward and gradient of a bf16 model: one cuDNN forward per attention and, in the
    gradient, one backward each; GQA keys reach cuDNN as 2 heads for 4 query heads."""
    model = build(_config(family, **overrides))
    batch = model.dummy_batch(2, 16)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))
    forward = _cudnn_calls(_lowered(model.apply, params, batch))
    assert [(c["target"], c["mask_type"], c["window"]) for c in forward] == [
        (FWD, mask, window) for mask, window in want
    ]
    grad_text = _lowered(_grad_fn(model), params, batch)
    grad = _cudnn_calls(grad_text)
    assert sorted(c["target"] for c in grad) == sorted([FWD, BWD] * len(want))
    assert all(c["scale"] == pytest.approx(8**-0.5) for c in forward + grad)
    assert "tensor<2x16x2x8xbf16>" in grad_text  # K = 2 key/value heads of width 8, bf16
    assert "__gpu$xla.gpu.triton" not in grad_text


@pytest.mark.parametrize(
    "options, mask, window, operands",
    [
        ({}, "NO_MASK", 0, 3),
        ({"causal": True}, "CAUSAL", 0, 3),
        ({"causal": True, "window": 3}, "CAUSAL", 4, 3),
        ({"segments": True}, "PADDING", 0, 5),  # q, k, v and the two length vectors
        ({"causal": True, "window": 0, "segments": True}, "PADDING_CAUSAL", 1, 5),
    ],
)
def test_kernel_masks_reach_cudnn(options, mask, window, operands):
    """Causal, causal window (cuDNN counts the query itself: ``window + 1``) and padding
    (segment ids as per-row lengths), with MQA (K = 1), T != S and an explicit scale."""
    q, k, v, _ = random_inputs(2, 16, 24, 4, 1, 32, BF16)
    options = dict(options)
    if options.pop("segments", False):
        options["q_segment_ids"] = segment_ids(16, [[(1, 10), (0, 6)], [(1, 16)]])
        options["kv_segment_ids"] = segment_ids(24, [[(1, 20), (0, 4)], [(1, 24)]])
    kw = call_kwargs(32, scale=0.25, **options)
    text = _lowered(lambda q, k, v: kernels.attention(q, k, v, impl="cudnn", **kw), q, k, v)
    assert _cudnn_calls(text) == [
        {"target": FWD, "mask_type": mask, "window": window, "scale": 0.25, "operands": operands}
    ]


def test_odd_lengths_are_padded_for_the_gradient():
    """jax's cuDNN wrapper refuses odd lengths under ``grad`` (a placeholder bias trips its
    bias check: tfmjax.compat); they are padded by one masked slot: T=11 -> 12, S=13 -> 14."""
    q, k, v, _ = random_inputs(2, 11, 13, 4, 2, 16, BF16)
    kw = call_kwargs(16, causal=True)

    def loss(q, k, v):
        return jnp.sum(kernels.attention(q, k, v, impl="cudnn", **kw).astype(jnp.float32))

    text = _lowered(jax.grad(loss, argnums=(0, 1, 2)), q, k, v)
    calls = _cudnn_calls(text)
    assert [(c["target"], c["mask_type"]) for c in calls] == [
        (FWD, "PADDING_CAUSAL"),
        (BWD, "PADDING_CAUSAL"),
    ]
    assert "tensor<2x12x4x16xbf16>" in text and "tensor<2x14x2x16xbf16>" in text
    assert "tensor<2x11x4x16xbf16>" in text  # dq comes back unpadded


# -- what cuDNN cannot do -------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, dtype, H, phrase",
    [
        ({"alibi_slopes": masks.alibi_slopes(4)}, BF16, 32, "ALiBi slopes"),
        ({"bias": jnp.zeros((1, 1, 16, 16))}, BF16, 32, "a dense bias"),
        ({"stride": 4}, BF16, 32, "strided pattern stride=4"),
        ({"global_tokens": 2}, BF16, 32, "global tokens"),
        ({"random_blocks": masks.RandomBlocks(1, 4)}, BF16, 32, "BigBird's random blocks"),
        ({"window": 3}, BF16, 32, "window=3 without causal"),
        ({}, jnp.float32, 32, "float32"),
        ({}, BF16, 12, "head width H=12"),
    ],
)
def test_kernel_refuses_what_cudnn_cannot_express(options, dtype, H, phrase):
    q, k, v, _ = random_inputs(1, 16, 16, 4, 2, H, dtype)
    with pytest.raises(ValueError, match=re.escape(phrase)) as err:
        cudnn_attention.attention(q, k, v, **call_kwargs(H, **options))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"position": "alibi"}, "model.position='alibi'"),
        ({"position": "relative"}, "model.attention_impl='cudnn'"),
        ({"attention_stride": 2}, "model.attention_stride=2"),
        ({"global_tokens": 1}, "model.global_tokens=1"),
        ({"random_blocks": 1, "window": 2}, "model.random_blocks=1"),
        ({"attention": "mla", "num_kv_heads": None}, "model.attention='mla'"),
        ({"family": "encoder_decoder", "window": 4}, "model.window=4"),
        ({"family": "encoder_only", "window": 4}, "model.window=4"),
        ({"dtype": "float32"}, "model.dtype='float32'"),
        ({"head_dim": 12}, "model.head_dim=12"),
        ({"num_heads": 1, "num_kv_heads": 1, "d_model": 512}, "model.head_dim=512"),
    ],
)
def test_config_refuses_what_cudnn_cannot_express(overrides, field):
    overrides = dict(overrides)
    with pytest.raises(ConfigError) as err:
        _config(overrides.pop("family", "decoder_only"), **overrides)
    message = str(err.value)
    assert message.startswith(field + " is invalid") and "\n" not in message
    assert "'xla'" in message


def test_config_accepts_what_cudnn_can_express():
    """Causal window on a decoder-only model, GQA/MQA, RoPE, learned or no positions."""
    _config("decoder_only", window=8, position="rope", num_kv_heads=1)
    _config("encoder_decoder", position="learned")
    _config("encoder_only", position="none", num_kv_heads=4)


# -- any other platform: one line -----------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_model():
    """A cudnn decoder-only model, a batch and params (zeros: only shapes matter here)."""
    model = build(_config("decoder_only", num_kv_heads=None))
    batch = model.dummy_batch(2, 8)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))
    return model, batch, jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), shapes)


def test_running_on_cpu_is_a_one_line_config_error(cpu_model):
    """A model's jitted forward and gradient, and an eager kernel call, on this CPU host:
    the ConfigError says to use auto or xla."""
    model, batch, params = cpu_model
    q, k, v, _ = random_inputs(1, 8, 8, 2, 2, 16, BF16)
    calls = {
        "jit": lambda: jax.jit(model.apply)(params, batch),
        "grad": lambda: jax.jit(_grad_fn(model))(params, batch),
        "eager": lambda: kernels.attention(q, k, v, impl="cudnn", **call_kwargs(16)),
    }
    for name, call in calls.items():
        with pytest.raises(ConfigError, match="runs on CUDA GPUs only") as err:
            call()
        message = str(err.value)
        assert "\n" not in message and "'auto' or 'xla'" in message, name
        assert "compiled for cpu" in message, name


def test_lowering_for_tpu_is_a_config_error(cpu_model):
    model, batch, params = cpu_model
    with pytest.raises(ConfigError, match="compiled for tpu"):
        _lowered(model.apply, params, batch, platform="tpu")


def test_decoding_offset_runs_xla_everywhere():
    """A traced ``q_offset`` (KV-cached decoding) cannot be said to cuDNN: the XLA path runs,
    here on the CPU too, and matches the reference."""
    q, k, v, _ = random_inputs(2, 2, 12, 4, 2, 16, BF16)
    kw = call_kwargs(16, causal=True, window=4)

    def attend(q, k, v, offset):
        return kernels.attention(q, k, v, impl="cudnn", **dict(kw, q_offset=offset))

    assert FWD not in _lowered(attend, q, k, v, jnp.int32(9))
    got = jax.jit(attend)(q, k, v, jnp.int32(9))
    want = kernels.attention(q, k, v, impl="reference", **dict(kw, q_offset=9))
    np.testing.assert_allclose(np.float32(got), np.float32(want), atol=2e-2)


def test_generation_on_cpu_uses_the_xla_path(cpu_model):
    """A cudnn model's KV-cached decode steps never reach cuDNN, so they compile here."""
    model, _, params = cpu_model
    cache = model.init_cache(2, 8)
    logits, _ = jax.jit(model.decode_step)(params, cache, jnp.array([3, 4]))
    assert logits.shape == (2, 32)


# -- batches whose padding per-row lengths cannot mask --------------------------------------


@pytest.mark.parametrize(
    "family, batch, name",
    [
        ("decoder_only", {"tokens": [[5, 6, 0, 7], [5, 6, 7, 8]]}, "tokens padding row 0"),
        ("decoder_only", {"tokens": [[0, 5, 6, 7], [5, 6, 7, 0]]}, "tokens padding row 0"),
        (
            "decoder_only",
            {"tokens": [[5, 6, 7, 8]] * 2, "segment_ids": [[1, 1, 1, 1], [1, 1, 2, 2]]},
            "segment_ids row 1",
        ),
        (
            "encoder_decoder",
            {"inputs": [[5, 6, 7, 8]] * 2, "targets": [[5, 6, 7, 0], [5, 0, 7, 0]]},
            "targets padding row 1",
        ),
    ],
)
def test_check_batch_refuses_inner_padding_and_packing(family, batch, name):
    batch = {key: np.asarray(value, np.int32) for key, value in batch.items()}
    model = build(_config(family))
    with pytest.raises(InputError, match=f"^{name} is ") as err:
        model.check_batch(batch)
    assert "\n" not in str(err.value)
    build(_config(family, attention_impl="xla")).check_batch(batch)  # others mask any ids


def test_check_batch_takes_trailing_padding():
    model = build(_config("encoder_decoder"))
    model.check_batch(
        {
            "inputs": np.array([[5, 6, 0, 0], [5, 6, 7, 8]], np.int32),
            "targets": np.array([[5, 0, 0, 0], [0, 0, 0, 0]], np.int32),
            "input_segment_ids": np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.int32),
        }
    )


# -- "auto" and its table -------------------------------------------------------------------


def test_auto_table_rows():
    """Every platform's rows start at length 0 and increase; GPUs and TPUs run Pallas on
    long queries (cuda: cuDNN from 1024 only where ``cudnn_ok``, test_auto_cudnn.py), cuda
    runs a one-token decode step through xla (measured on an H200), and the CPU switches
    to blockwise at 512."""
    for platform in kernels.LOWERING_PLATFORMS:
        starts = [start for start, _ in kernels.AUTO_TABLE[platform]]
        assert starts[0] == 0 and starts == sorted(set(starts)), platform
        assert {name for _, name in kernels.AUTO_TABLE[platform]} <= set(kernels.IMPLS)
    for platform in ("cuda", "rocm", "tpu", "gpu"):
        assert kernels.choose_impl("auto", q_len=4096, kv_len=4096, backend=platform) == "pallas"
        assert kernels.choose_impl("auto", q_len=2, kv_len=4096, backend=platform) == "pallas"
        decode = kernels.choose_impl("auto", q_len=1, kv_len=4096, backend=platform)
        assert decode == ("xla" if platform in ("cuda", "gpu") else "pallas"), platform
    n = kernels.BLOCKWISE_MIN_LEN_CPU
    assert kernels.choose_impl("auto", q_len=n, kv_len=n, backend="cpu") == "blockwise"


def test_auto_picks_cudnn_where_the_table_says_so(monkeypatch):
    """With cudnn in the cuda row (as a device benchmark may write it), ``auto`` lowers to
    cuDNN for cuda when the call is expressible, to Pallas when not (ALiBi), and the CPU
    row is untouched."""
    monkeypatch.setitem(dispatch.AUTO_TABLE, "cuda", ((0, "pallas"), (16, "cudnn")))
    assert kernels.choose_impl("auto", q_len=16, kv_len=16, backend="cuda") == "pallas"
    assert kernels.choose_impl("auto", q_len=16, kv_len=16, backend="cuda", cudnn_ok=True) == (
        "cudnn"
    )
    assert kernels.choose_impl("auto", q_len=8, kv_len=16, backend="cuda", cudnn_ok=True) == (
        "pallas"
    )
    q, k, v, _ = random_inputs(2, 16, 16, 4, 2, 16, BF16)

    def attend(**kw):
        return lambda q, k, v: kernels.attention(q, k, v, **call_kwargs(16, causal=True, **kw))

    assert _cudnn_calls(_lowered(attend(), q, k, v))[0]["mask_type"] == "CAUSAL"
    alibi = _lowered(attend(alibi_slopes=masks.alibi_slopes(4)), q, k, v)
    assert FWD not in alibi and "__gpu$xla.gpu.triton" in alibi
    assert FWD not in _lowered(attend(), q, k, v, platform="cpu")


def test_compat_leaves_jax_as_it_found_it():
    """The nominal cuDNN version is seen only inside the call (this host: no CUDA plugin)."""
    from jax._src.cudnn import fused_attention_stablehlo as fused

    before = fused.check_cudnn_version
    q, k, v, _ = random_inputs(1, 8, 8, 2, 2, 16, BF16)
    jax.jit(compat.cudnn_dot_product_attention).trace(q, k, v)
    assert fused.check_cudnn_version is before
    if not compat.cuda_plugin_present():
        with pytest.raises(RuntimeError, match="cuDNN is not detected"):
            jax.nn.dot_product_attention(q, k, v, implementation="cudnn")


# -- on a GPU only --------------------------------------------------------------------------


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on a CUDA GPU only")
@pytest.mark.parametrize(
    "T, S, options",
    [
        (32, 32, {"causal": True}),
        (31, 31, {"causal": True, "window": 5, "segments": True}),  # odd: padded by compat
        (24, 32, {"causal": False, "segments": True}),
    ],
)
def test_gpu_values_and_grads_match_xla(T, S, options):
    """The one numerical check of cuDNN attention: values and gradients against ``xla`` in
    bf16 (GQA, a causal window, padded rows, odd lengths, T != S). Needs a CUDA GPU: this
    CPU host cannot run cuDNN, so here it is skipped; the lowering tests above do not stand
    in for it."""
    from tfmjax.kernels.testing import assert_close, value_and_grads

    options = dict(options)
    q, k, v, d_out = random_inputs(2, T, S, 4, 2, 64, BF16)
    if options.pop("segments", False):
        options["q_segment_ids"] = segment_ids(T, [[(1, T - 5), (0, 5)], [(1, T)]])
        options["kv_segment_ids"] = segment_ids(S, [[(1, S - 5), (0, 5)], [(1, S)]])
    kw = call_kwargs(64, **options)
    got, want = (
        value_and_grads(functools.partial(kernels.attention, impl=impl), q, k, v, d_out, **kw)
        for impl in ("cudnn", "xla")
    )
    assert_close(got, want, BF16)
