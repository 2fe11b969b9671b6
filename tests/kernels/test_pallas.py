"""impl="pallas" (interpret mode on CPU) against the reference: values and gradients.

Interpret mode is slow, so the grid is lean: each case combines several features and
every feature (causal, T != S, ragged lengths, GQA 1/2/4/MQA, window, ALiBi, q_offset
static and traced, segment padding and packing, empty rows, bf16, mixed block sizes)
appears at least once. Tolerances as in test_blockwise.py: float32 2e-5 (outputs) and
1e-4 (gradients); bfloat16 2e-2 and 5e-2.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import kernels
from tfmjax.kernels import masks, pallas_attention, reference
from tfmjax.kernels.testing import (
    SEGMENT_CASES,
    assert_close,
    call_kwargs,
    random_inputs,
    segment_ids,
    value_and_grads,
)

BLOCKS = pallas_attention.BlockSizes(8, 8, 8, 8, 8, 8)


def pallas_fn(blocks=BLOCKS):
    return lambda *a, **kw: pallas_attention.attention(*a, **kw, block_sizes=blocks)


# name: (B, T, S, N, K, H, dtype, options, block sizes)
CASES = {
    "causal_ragged_gqa2": (2, 13, 21, 4, 2, 8, jnp.float32, dict(causal=True), BLOCKS),
    "t_gt_s_mha": (1, 27, 10, 4, 4, 8, jnp.float32, {}, BLOCKS),
    "mqa_window_bidirectional_alibi": (
        1,
        22,
        31,
        4,
        1,
        8,
        jnp.float32,
        dict(window=6, alibi_slopes=masks.alibi_slopes(4)),
        BLOCKS,
    ),
    "gqa4_causal_window_q_offset": (
        1,
        12,
        30,
        8,
        2,
        8,
        jnp.float32,
        dict(causal=True, window=7, q_offset=18),
        BLOCKS,
    ),
    "bf16_causal_gqa2_alibi": (
        2,
        24,
        24,
        4,
        2,
        16,
        jnp.bfloat16,
        dict(causal=True, alibi_slopes=masks.alibi_slopes(4)),
        BLOCKS,
    ),
    "mixed_blocks_causal": (
        1,
        37,
        45,
        4,
        2,
        8,
        jnp.float32,
        dict(causal=True),
        pallas_attention.BlockSizes(8, 16, 16, 8, 8, 16),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference(name):
    B, T, S, N, K, H, dtype, options, blocks = CASES[name]
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, dtype)
    kw = call_kwargs(H, **options)
    assert_close(
        value_and_grads(pallas_fn(blocks), q, k, v, d_out, **kw),
        value_and_grads(reference.attention, q, k, v, d_out, **kw),
        dtype,
    )


@pytest.mark.parametrize("causal,q_spec,kv_spec", SEGMENT_CASES.values(), ids=SEGMENT_CASES)
def test_segment_ids(causal, q_spec, kv_spec):
    q, k, v, d_out = random_inputs(2, 13, 21, 4, 2, 8, jnp.float32, seed=1)
    kw = call_kwargs(
        8,
        causal=causal,
        q_segment_ids=segment_ids(13, q_spec),
        kv_segment_ids=segment_ids(21, kv_spec),
    )
    assert_close(
        value_and_grads(pallas_fn(), q, k, v, d_out, **kw),
        value_and_grads(reference.attention, q, k, v, d_out, **kw),
        jnp.float32,
    )


def test_rows_with_nothing_to_see_are_zero_with_finite_grads():
    T = S = 12
    q, k, v, d_out = random_inputs(1, T, S, 2, 1, 8, jnp.float32, seed=2)
    q_seg = segment_ids(T, [[(1, 3), (9, 3), (2, 4), (0, 2)]])  # 9: no key; 0: padding
    kv_seg = segment_ids(S, [[(1, 7), (2, 5)]])  # query 6 (seg 2) sees no key <= 6
    kw = call_kwargs(8, causal=True, q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    out, dq, dk, dv = value_and_grads(pallas_fn(), q, k, v, d_out, **kw)
    empty = np.asarray(
        ~masks.dense_mask(T, S, causal=True, q_segment_ids=q_seg, kv_segment_ids=kv_seg)[0, 0].any(
            -1
        )
    )
    assert empty.sum() == 6
    assert np.all(np.asarray(out)[0, empty] == 0) and np.all(np.asarray(dq)[0, empty] == 0)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in (out, dq, dk, dv))
    np.testing.assert_allclose(
        out, value_and_grads(reference.attention, q, k, v, d_out, **kw)[0], atol=2e-5
    )


def test_traced_q_offset():
    """A traced offset (decoding) works; it visits every block instead of skipping."""
    q, k, v, d_out = random_inputs(1, 4, 40, 4, 2, 8, jnp.float32, seed=3)
    kw = call_kwargs(8, causal=True, window=9)
    fn = pallas_fn()

    @jax.jit
    def run(offset):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **{**kw, "q_offset": offset}), q, k, v)
        return (out, *vjp(d_out))

    for offset in (0, 36):
        want = value_and_grads(reference.attention, q, k, v, d_out, **{**kw, "q_offset": offset})
        assert_close(run(jnp.int32(offset)), want, jnp.float32)


def test_entry_point_runs_interpret_mode_on_cpu():
    q, k, v, _ = random_inputs(1, 16, 16, 4, 2, 8, jnp.float32)
    got = kernels.attention(q, k, v, causal=True, impl="pallas")
    want = kernels.attention(q, k, v, causal=True, impl="reference")
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_gpu_tiles_shrink_for_wide_heads():
    """Up to 128-wide heads keep the Triton tutorial's tiles; wider ones get tiles halved (up
    to 256) or quartered, never under Triton's 16, so a tile of queries holds at most 128 x
    128 features (MLA decodes with 288-wide heads, padded to 512 in the kernel)."""
    tutorial = pallas_attention.BlockSizes(128, 64, 32, 128, 128, 32)
    for H in (32, 64, 128):
        assert pallas_attention.BlockSizes.for_platform("cuda", H) == tutorial
    for H, shrink in ((192, 2), (256, 2), (288, 4), (512, 4)):
        blocks = pallas_attention.BlockSizes.for_platform("cuda", H)
        tiles = dataclasses.astuple(blocks)
        assert tiles == tuple(max(16, t // shrink) for t in dataclasses.astuple(tutorial))
        assert blocks.block_q * pallas_attention.pow2(H) <= 128 * 128 * 2
    assert pallas_attention.BlockSizes.for_platform("tpu", 288) == pallas_attention.BlockSizes()


def test_clear_errors():
    with pytest.raises(ValueError, match="power of two"):
        pallas_attention.BlockSizes(block_q=48)
    q, k, v, _ = random_inputs(1, 8, 8, 2, 2, 8, jnp.float32)
    with pytest.raises(ValueError, match="dense bias"):
        pallas_attention.attention(q, k, v, **call_kwargs(8, bias=jnp.zeros((1, 1, 8, 8))))
    with pytest.raises(ValueError, match="Triton"):
        pallas_attention.attention(q, k, v, **call_kwargs(8), block_sizes=BLOCKS, platform="cuda")
