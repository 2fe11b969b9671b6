"""impl="blockwise" against the reference (materialised softmax(QK^T/sqrt(H) + mask) V):
values and gradients.

Tolerances: float32 inputs, 2e-5 (outputs) and 1e-4 (gradients) max abs error, the
gap between two float32 summation orders at these sizes; bfloat16 inputs, 2e-2 on
outputs and 5e-2 on gradients (a few bf16 ulps of O(1) values; both sides round P
and the output to bf16 at different points).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import kernels
from tfmjax.kernels import block_geometry, blockwise, blockwise_layout, masks, reference
from tfmjax.kernels.testing import (
    SEGMENT_CASES,
    assert_close,
    call_kwargs,
    random_inputs,
    segment_ids,
    value_and_grads,
)

BLOCKS = blockwise.BlockSizes(
    block_q=8, block_k=8, block_q_bwd=4, block_k_bwd=8, kv_heads_per_step=2
)


def blockwise_results(q, k, v, d_out, **kw):
    fn = lambda q, k, v, **kw: blockwise.attention(q, k, v, **kw, block_sizes=BLOCKS)  # noqa: E731
    return value_and_grads(fn, q, k, v, d_out, **kw)


def reference_results(q, k, v, d_out, **kw):
    return value_and_grads(reference.attention, q, k, v, d_out, **kw)


# name: (B, T, S, N, K, H, dtype, options)
CASES = {
    "mha_scale": (2, 16, 16, 4, 4, 8, jnp.float32, dict(scale=0.3)),
    "ragged_causal_gqa2": (2, 13, 21, 4, 2, 8, jnp.float32, dict(causal=True)),
    "t_gt_s_gqa4": (1, 27, 10, 8, 2, 16, jnp.float32, {}),
    "mqa_causal_aligned": (2, 16, 16, 4, 1, 8, jnp.float32, dict(causal=True)),
    "window_causal": (1, 29, 29, 4, 2, 8, jnp.float32, dict(causal=True, window=5)),
    "window_bidirectional": (1, 22, 31, 4, 4, 8, jnp.float32, dict(window=6)),
    "alibi_causal": (
        1,
        20,
        20,
        4,
        2,
        8,
        jnp.float32,
        dict(causal=True, alibi_slopes=masks.alibi_slopes(4)),
    ),
    "q_offset_chunk": (1, 5, 23, 4, 2, 8, jnp.float32, dict(causal=True, q_offset=17)),
    "q_offset_window_alibi": (
        1,
        12,
        30,
        2,
        1,
        8,
        jnp.float32,
        dict(causal=True, q_offset=18, window=7, alibi_slopes=masks.alibi_slopes(2)),
    ),
    "bf16_causal_gqa2": (2, 24, 24, 4, 2, 16, jnp.bfloat16, dict(causal=True)),
    "bf16_window_mqa": (1, 21, 21, 4, 1, 16, jnp.bfloat16, dict(causal=True, window=6)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference(name):
    B, T, S, N, K, H, dtype, options = CASES[name]
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, dtype)
    kw = call_kwargs(H, **options)
    want = reference_results(q, k, v, d_out, **kw)
    assert_close(blockwise_results(q, k, v, d_out, **kw), want, dtype)


@pytest.mark.parametrize("causal,q_spec,kv_spec", SEGMENT_CASES.values(), ids=SEGMENT_CASES)
def test_segment_ids(causal, q_spec, kv_spec):
    q, k, v, d_out = random_inputs(2, 13, 21, 4, 2, 8, jnp.float32, seed=1)
    kw = call_kwargs(
        8,
        causal=causal,
        q_segment_ids=segment_ids(13, q_spec),
        kv_segment_ids=segment_ids(21, kv_spec),
    )
    want = reference_results(q, k, v, d_out, **kw)
    assert_close(blockwise_results(q, k, v, d_out, **kw), want, jnp.float32)


def test_rows_with_nothing_to_see_are_zero_with_finite_grads():
    # Query segment 0 (padding) and segment 9 (no key has it) see nothing; with causal
    # and q_offset=0 the first query row of segment 2 sees no key either.
    B, T, S, N, K, H = 1, 12, 12, 2, 1, 8
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, jnp.float32, seed=2)
    q_seg = segment_ids(T, [[(1, 3), (9, 3), (2, 4), (0, 2)]])
    kv_seg = segment_ids(S, [[(1, 7), (2, 5)]])
    kw = call_kwargs(H, causal=True, q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    out, dq, dk, dv = blockwise_results(q, k, v, d_out, **kw)
    empty = np.asarray(
        ~masks.dense_mask(T, S, causal=True, q_segment_ids=q_seg, kv_segment_ids=kv_seg)[0, 0].any(
            -1
        )
    )
    assert empty.sum() == 6
    assert np.all(np.asarray(out)[0, empty] == 0)
    assert np.all(np.asarray(dq)[0, empty] == 0)
    for g in (out, dq, dk, dv):
        assert np.all(np.isfinite(np.asarray(g)))
    want = reference_results(q, k, v, d_out, **kw)
    np.testing.assert_allclose(out, want[0], atol=2e-5)


def test_traced_q_offset():
    """Decoding passes the cache index as a traced scalar: still exact, still skipping."""
    B, T, S, N, K, H = 1, 4, 40, 4, 2, 8
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, jnp.float32, seed=3)
    kw = call_kwargs(H, causal=True, window=9)

    @jax.jit
    def run(q, k, v, offset):
        return value_and_grads(
            lambda *a, **kw: blockwise.attention(*a, **kw, block_sizes=BLOCKS),
            q,
            k,
            v,
            d_out,
            **{**kw, "q_offset": offset},
        )

    for offset in (0, 13, 36):
        want = reference_results(q, k, v, d_out, **{**kw, "q_offset": offset})
        assert_close(run(q, k, v, jnp.int32(offset)), want, jnp.float32)


def test_entry_point_and_auto_choice():
    q, k, v, _ = random_inputs(1, 16, 16, 4, 2, 8, jnp.float32)
    got = kernels.attention(q, k, v, causal=True, impl="blockwise")
    want = kernels.attention(q, k, v, causal=True, impl="reference")
    np.testing.assert_allclose(got, want, atol=2e-5)
    n = kernels.BLOCKWISE_MIN_LEN_CPU
    assert kernels.choose_impl("auto", q_len=n, kv_len=n, backend="cpu") == "blockwise"
    assert kernels.choose_impl("auto", q_len=n // 2, kv_len=n // 2, backend="cpu") == "xla"
    assert kernels.choose_impl("auto", q_len=1, kv_len=8 * n, backend="cpu") == "xla"  # decode


def test_rejects_bias_and_bad_blocks():
    q, k, v, _ = random_inputs(1, 8, 8, 2, 2, 8, jnp.float32)
    with pytest.raises(ValueError, match="dense bias"):
        blockwise.attention(q, k, v, **call_kwargs(8, bias=jnp.zeros((1, 1, 8, 8))))
    with pytest.raises(ValueError, match="block_q"):
        blockwise.BlockSizes(block_q=0)


def brute_force_ranges(a_lo, a_hi, block, num_blocks, dmin, dmax, length, full_ok):
    """Which blocks hold a visible pair, and which hold only visible pairs, by brute force."""
    a = np.arange(a_lo, a_hi + 1)[:, None]
    needed, full = [], []
    for b in range(num_blocks):
        x = np.arange(b * block, b * block + block)[None, :]
        d = a - x
        ok = np.ones(d.shape, bool)
        if dmin is not None:
            ok &= d >= dmin
        if dmax is not None:
            ok &= d <= dmax
        needed.append(ok.any())  # a block whose visible pairs are all padding may
        ok &= x < length  # be visited (masked), never skipped wrongly
        full.append(ok.all() and full_ok)
    return np.array(needed), np.array(full)


@pytest.mark.parametrize(
    "causal,window", [(False, None), (True, None), (True, 5), (False, 3), (True, 0), (False, 0)]
)
def test_block_range_is_exact(causal, window):
    """The needed range is exactly the blocks with a visible pair (so skipping never drops
    work and never does work that is fully masked), and the unmasked range exactly the
    blocks with only visible pairs."""
    dmin, dmax = block_geometry.distance_bounds(causal, window)
    grid = itertools.product((4, 8), (29, 32), (4, 8), range(0, 40, 3))
    for block, length, a_block, start in grid:
        num_blocks = -(-length // block)
        a_lo, a_hi = start, start + a_block - 1
        lo, flo, fhi, hi = (
            int(x)
            for x in block_geometry.block_range(
                a_lo, a_hi, block, num_blocks, dmin, dmax, num_full=length // block
            )
        )
        needed, full = brute_force_ranges(a_lo, a_hi, block, num_blocks, dmin, dmax, length, True)
        got_needed = np.zeros(num_blocks, bool)
        got_needed[lo:hi] = True
        got_full = np.zeros(num_blocks, bool)
        got_full[flo:fhi] = True
        np.testing.assert_array_equal(got_needed, needed, err_msg=f"{start=} {block=} {length=}")
        np.testing.assert_array_equal(got_full, full, err_msg=f"{start=} {block=} {length=}")


def test_block_sizes_are_frozen_and_backward_falls_back():
    """``BlockSizes`` is an immutable value (jit keys on it); ``backward()`` takes the
    backward lengths, or the forward ones where those are None."""
    import dataclasses

    sizes = blockwise.BlockSizes(block_q=8, block_k=16, block_q_bwd=2, block_k_bwd=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.block_q = 4
    assert hash(sizes) == hash(blockwise.BlockSizes(8, 16, 2, None))
    back = sizes.backward()
    assert (back.block_q, back.block_k) == (2, 16)


def test_floor_div_matches_python_floor_division():
    """The Pallas-safe ``x // d`` rounds down for negative x and exact multiples too."""
    x = np.arange(-40, 41, dtype=np.int32)
    for d in (1, 2, 3, 8):
        got = np.asarray(block_geometry._floor_div(jnp.asarray(x), d))
        np.testing.assert_array_equal(got, x // d, err_msg=f"d={d}")


def test_geometry_uses_as_few_blocks_as_cover_the_sequence():
    """ceil(T / block) blocks of min(block, T) rows: a ragged last block, no spare ones.
    Geometry and its statics are hashable values (jit and custom_vjp key on them)."""
    sizes = blockwise.BlockSizes()
    for T, S, bq, bk, nq, nk in [(9, 16, 4, 8, 3, 2), (8, 5, 4, 8, 2, 1), (1, 7, 4, 2, 1, 4)]:
        st = blockwise_layout.BlockwiseStatic(
            causal=False, window=None, scale=1.0, q_len=T, kv_len=S, blocks=sizes
        )
        make = blockwise_layout.PassGeometry.make
        geo = make(st, bq, bk, K=2, G=1)
        assert hash(geo) == hash(make(st, bq, bk, K=2, G=1))  # static args
        assert (geo.bq, geo.bk, geo.nq, geo.nk) == (min(bq, T), min(bk, S), nq, nk)
