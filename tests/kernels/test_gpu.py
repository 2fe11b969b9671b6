"""The Pallas kernel compiled by Triton on a CUDA GPU against the reference: values and
gradients at block sizes Triton takes (16 and up; the interpret-mode tests in
``test_pallas.py`` use 8, which on a GPU leave the Triton branch out). On a Hopper GPU, the
Mosaic GPU kernels too (values and gradients for every mask they take, and the
``TFMJAX_PALLAS_GPU`` switch; their CPU checks are ``test_mosaic_gpu.py``).

Needs a CUDA GPU; on the CPU hosts of CI it is skipped and ``test_pallas.py`` (interpret
mode, the same kernel bodies) and ``test_lowering.py`` (the Triton lowering) stand for it.
fp32 cases run at ``jax_default_matmul_precision="highest"`` (at the default, XLA and Triton
use TF32 dots, ~1e-3); tolerances as ``tfmjax.kernels.testing.TOLERANCE``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tfmjax.kernels.pallas_tuning as pallas_tuning
from tfmjax.compat import triton_custom_call_target
from tfmjax.kernels import attention, masks, mosaic_attention, pallas_attention, reference
from tfmjax.kernels.testing import (
    assert_close,
    call_kwargs,
    random_inputs,
    segment_ids,
    value_and_grads,
)

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu", reason="these kernels run on a CUDA GPU only"
)

# name: (B, T, S, N, K, H, dtype, options, (query block, key block))
CASES = {
    "causal_gqa2_fp32": (2, 256, 256, 4, 2, 64, jnp.float32, dict(causal=True), (64, 64)),
    "full_ragged_mha_fp32": (1, 200, 328, 4, 4, 64, jnp.float32, {}, (32, 64)),
    "window_alibi_mqa_fp32": (
        1,
        192,
        192,
        4,
        1,
        32,
        jnp.float32,
        dict(causal=True, window=40, alibi_slopes=masks.alibi_slopes(4)),
        (32, 32),
    ),  # fmt: skip
    "causal_gqa4_bf16": (2, 512, 512, 8, 2, 128, jnp.bfloat16, dict(causal=True), (64, 64)),
    "offset_bf16": (1, 64, 320, 4, 2, 64, jnp.bfloat16, dict(causal=True, q_offset=256), (16, 64)),
    # The sparse patterns: strided + global tokens, and BigBird's random blocks (a lax.cond
    # per candidate block), causal and not.
    "strided_global_gqa2_fp32": (
        1,
        256,
        256,
        4,
        2,
        64,
        jnp.float32,
        dict(causal=True, window=32, stride=64, global_tokens=16),
        (32, 32),
    ),  # fmt: skip
    "bigbird_causal_fp32": (
        2,
        256,
        256,
        4,
        2,
        64,
        jnp.float32,
        dict(causal=True, window=32, global_tokens=16, random_blocks=masks.RandomBlocks(2, 32, 1)),
        (32, 32),
    ),  # fmt: skip
    "bigbird_full_bf16": (
        1,
        256,
        256,
        4,
        4,
        64,
        jnp.bfloat16,
        dict(window=32, global_tokens=16, random_blocks=masks.RandomBlocks(3, 32, 2, 8)),
        (32, 32),
    ),  # fmt: skip
}


def _assert_triton_matches_reference(blocks, dtype, q, k, v, d_out, kw):
    """Values and gradients of the Pallas kernel with ``blocks`` against the reference."""
    with jax.default_matmul_precision("highest"):
        got = value_and_grads(
            lambda *a, **o: pallas_attention.attention(*a, **o, block_sizes=blocks),
            q, k, v, d_out, **kw,
        )  # fmt: skip
        want = value_and_grads(reference.attention, q, k, v, d_out, **kw)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_matches_reference(name):
    B, T, S, N, K, H, dtype, options, (bq, bk) = CASES[name]
    blocks = pallas_attention.BlockSizes(bq, bk, bq, bk, bq, bk)
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, dtype)
    _assert_triton_matches_reference(blocks, dtype, q, k, v, d_out, call_kwargs(H, **options))


def test_triton_segments_and_padding():
    T = S = 128
    q, k, v, d_out = random_inputs(2, T, S, 4, 2, 64, jnp.float32, seed=1)
    spec = [[(1, 50), (2, 60), (0, 18)], [(1, 128)]]
    kw = call_kwargs(
        64, causal=True, q_segment_ids=segment_ids(T, spec), kv_segment_ids=segment_ids(S, spec)
    )
    blocks = pallas_attention.BlockSizes(32, 32, 32, 32, 32, 32)
    _assert_triton_matches_reference(blocks, jnp.float32, q, k, v, d_out, kw)


@pytest.mark.parametrize("H", [192, 288])
def test_triton_wide_heads_fit_with_the_default_blocks(H):
    """Heads wider than 128 (MLA decodes with ``R + Hr = 288``) at the default tiles:
    :meth:`BlockSizes.for_platform` shrinks them to fit a GPU's shared memory (at the full
    tiles an H200 refused: 395,520 bytes asked of 232,448).

    Against the float32 reference on the same bf16 inputs, within 4 bf16 steps (2^-8) of
    each output's largest magnitude: summed over 288 features, dv (|dv| up to ~10) differs
    from the bf16 reference by 2 steps, past the fixed 5e-2 of the narrower cases."""
    q, k, v, d_out = random_inputs(1, 256, 256, 4, 1, H, jnp.bfloat16, seed=2)
    kw = call_kwargs(H, causal=True)
    got = value_and_grads(pallas_attention.attention, q, k, v, d_out, **kw)  # default tiles
    with jax.default_matmul_precision("highest"):
        exact = value_and_grads(
            reference.attention, *(x.astype(jnp.float32) for x in (q, k, v, d_out)), **kw
        )
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, exact, strict=True):
        g, e = np.asarray(g, np.float32), np.asarray(e, np.float32)
        tol = 4 * 2.0**-8 * np.abs(e).max()
        assert np.abs(g - e).max() <= tol, f"{name}: {np.abs(g - e).max():.3g} > {tol:.3g}"


# ---- the Hopper kernels (Pallas Mosaic GPU) --------------------------------------------

HOPPER = (
    jax.default_backend() == "gpu"
    and pallas_tuning.gpu_family(jax.devices()[0].device_kind) == "hopper"
)
needs_hopper = pytest.mark.skipif(
    not (HOPPER and mosaic_attention.available()),
    reason="the Mosaic GPU kernels need a Hopper GPU (sm_90) and jax >= 0.11",
)
# bf16 inputs and bf16 P/dS in the matmuls against a float32 reference (as the interpreter
# tests of test_mosaic_gpu.py: measured there 0.002-0.008 on outputs, 0.3-0.55% of the
# largest gradient entry).
MOSAIC_OUT_ATOL = 0.02
MOSAIC_GRAD_RTOL = 0.015
PACKED = [[(1, 200), (2, 250), (3, 62)], [(4, 512)]]  # three documents, then one
RIGHT_PADDED = [[(1, 300), (0, 84)], [(1, 384)]]
MOSAIC_CASES = {
    # name: (B, T, S, N, K, H, causal, segment runs or None, q_offset)
    "full_mha_h128": (2, 1024, 1024, 4, 4, 128, False, None, 0),
    "causal_gqa4_h128": (2, 1024, 1024, 8, 2, 128, True, None, 0),
    "causal_mqa_h64_offset_ragged": (1, 300, 364, 4, 1, 64, True, None, 64),
    "packed_causal_gqa2_h64": (2, 512, 512, 4, 2, 64, True, PACKED, 0),
    "right_padded_full_h32": (2, 384, 384, 2, 2, 32, False, RIGHT_PADDED, 0),
    "causal_keys_beyond_queries": (1, 64, 640, 4, 1, 64, True, None, 0),  # zero-trip loops
}


@needs_hopper
@pytest.mark.parametrize("name", sorted(MOSAIC_CASES))
def test_mosaic_matches_reference(name):
    """The compiled Hopper kernels' values and gradients against the float32 reference on
    the same bf16 inputs, for every mask they take."""
    _assert_mosaic_matches_reference(name)


@needs_hopper
@pytest.mark.parametrize("name", ["causal_gqa4_h128", "packed_causal_gqa2_h64", "full_mha_h128"])
def test_mosaic_pingpong_matches_reference(name):
    """The forward's ping-pong schedule (its compute warpgroups take turns) on a GPU, where a
    turn taken a different number of times by the two warpgroups would hang."""
    _assert_mosaic_matches_reference(name, pingpong=True)


def _assert_mosaic_matches_reference(name, pingpong=False):
    B, T, S, N, K, H, causal, runs, offset = MOSAIC_CASES[name]
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, jnp.bfloat16, seed=3)
    q_seg = kv_seg = None
    if runs is not None:
        q_seg, kv_seg = segment_ids(T, runs), segment_ids(S, runs)

    def mosaic(q, k, v):
        return mosaic_attention.attention(
            q, k, v, q_seg, kv_seg, causal=causal, scale=H**-0.5, q_offset=offset,
            pingpong=pingpong,
        ).astype(jnp.float32)  # fmt: skip

    def ref(q, k, v):
        kw = call_kwargs(H, causal=causal, q_segment_ids=q_seg, kv_segment_ids=kv_seg)
        return reference.attention(*(x.astype(jnp.float32) for x in (q, k, v)), **{
            **kw, "q_offset": offset,
        })  # fmt: skip

    d_out = d_out.astype(jnp.float32)
    with jax.default_matmul_precision("highest"):
        got = value_and_grads(mosaic, q, k, v, d_out)
        want = value_and_grads(ref, q, k, v, d_out)
    for part, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        assert np.all(np.isfinite(g)), f"{part} has non-finite values"
        tol = MOSAIC_OUT_ATOL if part == "out" else MOSAIC_GRAD_RTOL * np.abs(w).max()
        assert np.abs(g - w).max() <= tol, f"{part}: {np.abs(g - w).max():.3g} > {tol:.3g}"
    if runs is RIGHT_PADDED:  # padded query rows see nothing: exactly zero
        assert not np.asarray(got[0])[0, 300:].any()


@needs_hopper
def test_the_env_routes_pallas_to_mosaic_on_a_gpu(monkeypatch):
    """``TFMJAX_PALLAS_GPU=mosaic``: ``impl="pallas"`` lowers to the Mosaic GPU kernels (no
    Triton call) and gives the direct call's numbers; unset, it runs Triton."""
    q, k, v, _ = random_inputs(1, 512, 512, 4, 2, 128, jnp.bfloat16, seed=4)

    def entry(q, k, v):
        return attention(q, k, v, causal=True, impl="pallas")

    monkeypatch.setenv(mosaic_attention.PALLAS_GPU_ENV, "mosaic")
    fresh = jax.jit(lambda *a: entry(*a))  # the choice is read when a call is traced
    text = fresh.lower(q, k, v).as_text()
    assert "mosaic_gpu" in text and triton_custom_call_target() not in text
    direct = mosaic_attention.attention(q, k, v, None, None, causal=True, scale=128**-0.5)
    np.testing.assert_array_equal(np.asarray(fresh(q, k, v)), np.asarray(direct))
    monkeypatch.delenv(mosaic_attention.PALLAS_GPU_ENV)
    text = jax.jit(lambda *a: entry(*a)).lower(q, k, v).as_text()
    assert "mosaic_gpu" not in text and triton_custom_call_target() in text
