"""The Hopper (Mosaic GPU) flash kernels on a CPU host: what a CPU can check.

* Values and gradients against the reference (float32 softmax of bf16 inputs) in Pallas's
  GPU interpreter, which simulates shared memory, the three warpgroups, the TMA copies and
  the barriers: full and causal, a static query offset with padded lengths, GQA, MQA,
  segment ids (packed rows and trailing padding), head widths 32/64/128.
* Lowering for ``cuda`` from this host builds the real Mosaic GPU module (its custom call,
  no Triton call, nothing interpreted) for the forward and the gradient, when
  ``TFMJAX_PALLAS_GPU=mosaic``; what the kernels do not take lowers to Triton (the rule).

Not checked here: that ptxas compiles the module and the numbers on a GPU
(``tests/kernels/test_gpu.py``, ``tools/device_check.sh gpu-tests``).
jax 0.10 has no GPU interpreter: these tests need jax >= 0.11 (the fast half's stack).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from tfmjax import kernels
from tfmjax.compat import gpu_lowering_target, triton_custom_call_target
from tfmjax.kernels import mosaic_attention, reference

pytestmark = [
    pytest.mark.skipif(
        not mosaic_attention.available(), reason=f"jax {jax.__version__}: no Mosaic GPU"
    ),
    pytest.mark.xdist_group("mosaic_gpu"),  # one interpreted kernel at a time per worker
]

MOSAIC_GPU = "mosaic_gpu_v2"  # custom-call target of a Pallas Mosaic GPU kernel
TRITON = triton_custom_call_target()
# bf16 inputs and bf16 P/dS in the matmuls against a float32 reference: measured max
# errors 0.002-0.008 on outputs of size ~1 and 0.3-0.55% of the largest gradient entry.
OUT_ATOL = 0.02
GRAD_RTOL = 0.015


def _inputs(B, T, S, N, K, H, segments):
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (B, T, N, H)).astype(jnp.bfloat16)
    k = jax.random.normal(ks[1], (B, S, K, H)).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], (B, S, K, H)).astype(jnp.bfloat16)
    cotangent = jax.random.normal(ks[3], (B, T, N, H))
    q_seg = kv_seg = None
    if segments:  # two packed segments, then trailing padding (segment 0)

        def ids(n, pad):
            half = n // 2
            parts = [jnp.ones(half), 2 * jnp.ones(n - half - pad), jnp.zeros(pad)]
            return jnp.broadcast_to(jnp.concatenate(parts).astype(jnp.int32), (B, n))

        q_seg, kv_seg = ids(T, 5), ids(S, 3)
    return (q, k, v), (q_seg, kv_seg), cotangent


CASES = {
    # name: (B, T, S, N, K, H, causal, segments, q_offset)
    "full_mha_h64": (1, 128, 128, 2, 2, 64, False, False, 0),
    "causal_gqa_offset_padded": (1, 256, 300, 4, 2, 64, True, False, 44),
    "segments_full_h128_padded": (1, 200, 200, 2, 2, 128, False, True, 0),
    "segments_causal_mqa_h32": (2, 128, 128, 2, 1, 32, True, True, 0),
    # keys past every query: their dK/dV CTAs see no query block (zero-trip loops)
    "causal_keys_beyond_queries": (1, 64, 640, 2, 1, 64, True, False, 0),
}


@pytest.mark.parametrize("name", CASES)
def test_interpreted_values_and_grads_match_reference(name):
    _assert_matches_reference(*CASES[name])


# (block_k, block_k_dq, block_q_dkv, stages): what bench/attention_peers.py --mosaic-tiles
# may try on a GPU; here the block loops and a ring of 3 slots against the same reference.
TILES = {"k64_q128_3_stages": (64, 128, 128, 3)}


@pytest.mark.parametrize("name", TILES)
def test_other_tiles_give_the_same_numbers(name):
    _assert_matches_reference(*CASES["causal_gqa_offset_padded"], tiles=TILES[name])


@pytest.mark.parametrize(
    "name", ["causal_gqa_offset_padded", "segments_causal_mqa_h32", "causal_keys_beyond_queries"]
)
def test_pingpong_forward_equals_the_free_schedule_bit_for_bit(name):
    """The ping-pong schedule only orders the two compute warpgroups' matrix multiplies: the
    same sums in the same order, so the same bits (and no hang: both take every turn). The
    backward does not use it."""
    B, T, S, N, K, H, causal, segments, offset = CASES[name]
    (q, k, v), (q_seg, kv_seg), _ = _inputs(B, T, S, N, K, H, segments)
    outs = [
        mosaic_attention.attention(
            q, k, v, q_seg, kv_seg, causal=causal, scale=H**-0.5, q_offset=offset,
            interpret=True, pingpong=pingpong,
        )
        for pingpong in (False, True)
    ]  # fmt: skip
    free, pingpong = (np.asarray(o.astype(jnp.float32)) for o in outs)
    np.testing.assert_array_equal(pingpong, free)
    ref = reference.attention(
        *(x.astype(jnp.float32) for x in (q, k, v)), causal=causal, scale=H**-0.5,
        q_segment_ids=q_seg, kv_segment_ids=kv_seg, window=None, alibi_slopes=None,
        bias=None, q_offset=offset,
    )  # fmt: skip
    np.testing.assert_allclose(pingpong, np.asarray(ref), atol=OUT_ATOL)


def test_tiles_a_kernel_cannot_take_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"blocks in \(64, 128\) and stages in \(2, 3, 4\)"):
        mosaic_attention.attention(q, k, v, causal=True, scale=0.125, tiles=(32, 64, 64, 2))


def _assert_matches_reference(B, T, S, N, K, H, causal, segments, offset, tiles=None):
    qkv, (q_seg, kv_seg), cotangent = _inputs(B, T, S, N, K, H, segments)
    mask = dict(causal=causal, scale=H**-0.5)

    def mosaic(q, k, v):
        return mosaic_attention.attention(
            q, k, v, q_seg, kv_seg, q_offset=offset, interpret=True, tiles=tiles, **mask
        ).astype(jnp.float32)

    def ref(q, k, v):
        f32 = [x.astype(jnp.float32) for x in (q, k, v)]
        return reference.attention(
            *f32,
            q_segment_ids=q_seg,
            kv_segment_ids=kv_seg,
            window=None,
            alibi_slopes=None,
            bias=None,
            q_offset=offset,
            **mask,
        )

    out, ref_out = mosaic(*qkv), ref(*qkv)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), atol=OUT_ATOL)
    if segments:  # padded query rows see nothing: exactly zero
        assert not np.asarray(out)[:, -5:].any()
    grads = jax.grad(lambda *x: jnp.sum(mosaic(*x) * cotangent), (0, 1, 2))(*qkv)
    ref_grads = jax.grad(lambda *x: jnp.sum(ref(*x) * cotangent), (0, 1, 2))(*qkv)
    for name_, g, r in zip("qkv", grads, ref_grads, strict=True):
        g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
        scale = np.abs(r).max()
        assert np.abs(g - r).max() <= GRAD_RTOL * scale, f"d{name_}"


def _model_call(q, k, v, **options):
    return kernels.attention(
        q,
        k,
        v,
        causal=True,
        q_segment_ids=None,
        kv_segment_ids=None,
        window=options.get("window"),
        alibi_slopes=options.get("alibi_slopes"),
        bias=None,
        q_offset=0,
        scale=0.125,
        impl="pallas",
    )


def _exported_for_cuda(fn, *args) -> str:
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in (TRITON, MOSAIC_GPU)]
    with gpu_lowering_target():
        # a fresh function each time: jax caches a trace per function, and the kernel
        # choice (TFMJAX_PALLAS_GPU) is made when a call is traced
        fresh = jax.jit(lambda *a: fn(*a))
        exported = export.export(fresh, platforms=("cuda",), disabled_checks=checks)(*args)
    return exported.mlir_module()


def _calls(text):
    return {"mosaic": text.count(f"@{MOSAIC_GPU}("), "triton": text.count(f"@{TRITON}(")}


def _qkv(dtype=jnp.bfloat16, T=256, H=64):
    ks = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(ks[0], (1, T, 4, H)).astype(dtype)
    kv = [jax.random.normal(kk, (1, T, 2, H)).astype(dtype) for kk in ks[1:]]
    return q, *kv


def test_cuda_lowering_builds_mosaic_gpu_kernels_forward_and_backward(monkeypatch):
    monkeypatch.setenv(mosaic_attention.PALLAS_GPU_ENV, "mosaic")
    q, k, v = _qkv()
    assert _calls(_exported_for_cuda(_model_call, q, k, v)) == {"mosaic": 1, "triton": 0}

    def loss(q, k, v):
        return jnp.sum(_model_call(q, k, v).astype(jnp.float32))

    grad = jax.grad(loss, (0, 1, 2))
    # forward (saved for the backward), dQ, dK/dV
    assert _calls(_exported_for_cuda(grad, q, k, v)) == {"mosaic": 3, "triton": 0}


@pytest.mark.parametrize(
    "name,pingpong",
    [*((n, False) for n in [*CASES, "fp16_segments_h128"])]
    + [("segments_causal_mqa_h32", True), ("causal_gqa_offset_padded", True)],
)
def test_every_case_lowers_for_cuda(name, pingpong):
    """The GPU path itself (not the interpreter's), forward and gradient, for each case:
    jax's Mosaic GPU lowering checks layouts, register-operand matmuls, TMA sizes and the
    227 KiB of shared memory. What it cannot check (ptxas, registers, hangs) needs a GPU."""
    B, T, S, N, K, H, causal, segments, offset = CASES.get(
        name, (1, 256, 192, 4, 2, 128, False, True, 0)
    )
    qkv, (q_seg, kv_seg), _ = _inputs(B, T, S, N, K, H, segments)
    if name.startswith("fp16"):
        qkv = tuple(x.astype(jnp.float16) for x in qkv)

    def loss(q, k, v):
        out = mosaic_attention.attention(
            q, k, v, q_seg, kv_seg, causal=causal, scale=H**-0.5, q_offset=offset,
            pingpong=pingpong,
        )  # fmt: skip
        return jnp.sum(out.astype(jnp.float32))

    assert _calls(_exported_for_cuda(jax.grad(loss, (0, 1, 2)), *qkv)) == {
        "mosaic": 3,
        "triton": 0,
    }


def test_every_tile_setting_the_bench_tries_fits_at_head_width_128():
    """bench/attention_peers.py --mosaic-tiles: each setting lowers for cuda at H=128, within
    a Hopper SM's shared memory (checked by the lowering), so no device time is spent on one
    that cannot run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from attention_peers import MOSAIC_TILES, mosaic_row_options, mosaic_tile_rows

    settings = [mosaic_row_options(row) for row in mosaic_tile_rows()]
    assert [s["tiles"] for s in settings if not s["pingpong"]] == MOSAIC_TILES
    assert [s["tiles"] for s in settings if s["pingpong"]] == MOSAIC_TILES[:2]
    q, k, v = _qkv(H=128)
    for options in settings:

        def loss(q, k, v, options=options):
            out = mosaic_attention.attention(q, k, v, causal=True, scale=0.1, **options)
            return jnp.sum(out.astype(jnp.float32))

        got = _calls(_exported_for_cuda(jax.grad(loss, (0, 1, 2)), q, k, v))
        assert got == {"mosaic": 3, "triton": 0}, options


def test_runtimes_whose_ptxas_miscompiles_go_to_triton(monkeypatch):
    """CUDA runtimes 12.8.0-12.9.0 miscompile masked Mosaic GPU attention (jax's own kernel
    refuses causal there): every call runs Triton, saying why; 12.9.1 runs Mosaic."""
    from tfmjax import compat

    monkeypatch.setenv(mosaic_attention.PALLAS_GPU_ENV, "mosaic")
    q, k, _ = _qkv()
    monkeypatch.setattr(compat, "cuda_runtime_version", lambda: 12085)
    kernel, why = mosaic_attention.gpu_kernel(q, k, q_offset=0)
    assert kernel == "triton" and "CUDA runtime 12085" in why and "ptxas" in why
    monkeypatch.setattr(compat, "cuda_runtime_version", lambda: 12091)
    assert mosaic_attention.gpu_kernel(q, k, q_offset=0)[0] == "mosaic"


@pytest.mark.parametrize(
    "options, why",
    [
        ({"window": 32}, "sliding window"),
        ({"alibi_slopes": jnp.ones((4,), jnp.float32)}, "ALiBi"),
        ({"dtype": jnp.float32}, "dtype float32"),
        ({"H": 256}, "head width 256"),
    ],
    ids=["window", "alibi", "float32", "h256"],
)
def test_what_mosaic_does_not_take_lowers_to_triton(monkeypatch, options, why):
    monkeypatch.setenv(mosaic_attention.PALLAS_GPU_ENV, "mosaic")
    shape = {key: options.pop(key) for key in ("dtype", "H") if key in options}
    q, k, v = _qkv(**shape)
    kernel, reason = mosaic_attention.gpu_kernel(
        q, k, **{"window": None, "alibi_slopes": None, "q_offset": 0, **options}
    )
    assert kernel == "triton" and why in reason
    assert _calls(_exported_for_cuda(lambda *x: _model_call(*x, **options), q, k, v)) == {
        "mosaic": 0,
        "triton": 1,
    }


def test_a_traced_offset_goes_to_triton(monkeypatch):
    monkeypatch.setenv(mosaic_attention.PALLAS_GPU_ENV, "mosaic")
    q, k, _ = _qkv()
    seen = []
    jax.jit(lambda off: seen.append(mosaic_attention.gpu_kernel(q, k, q_offset=off)) or off)(
        jnp.int32(3)
    )
    assert seen[0][0] == "triton" and "traced q_offset" in seen[0][1]
    assert mosaic_attention.gpu_kernel(q, k, q_offset=3)[0] == "mosaic"


def test_default_is_triton_and_a_wrong_setting_says_what_to_set(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.delenv(mosaic_attention.PALLAS_GPU_ENV, raising=False)
    assert mosaic_attention.gpu_kernel(q, k, q_offset=0)[0] == "triton"
    assert _calls(_exported_for_cuda(_model_call, q, k, v)) == {"mosaic": 0, "triton": 1}
    monkeypatch.setenv(mosaic_attention.PALLAS_GPU_ENV, "cutlass")
    with pytest.raises(ValueError, match="TFMJAX_PALLAS_GPU='cutlass' is not one of"):
        mosaic_attention.gpu_kernel(q, k, q_offset=0)
