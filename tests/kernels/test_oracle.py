"""Every attention implementation against an independent NumPy oracle (``tests/oracle.py``).

The other kernel tests compare the implementations with ``impl="reference"``, and every
implementation builds its masks with the same ``tfmjax.kernels.masks``: a wrong mask rule
there is invisible to them. The oracle writes the rules out again from the formulas (causal,
``q_offset``, window, segment ids, ALiBi, dense bias, GQA, empty rows), so these tests
catch it. The sparse patterns (``stride``: Child et al. 2019; ``global_tokens``: Beltagy et
al. 2020; ``random_blocks``: BigBird, Zaheer et al. 2020) are cases here too, alone and
combined with windows, segment ids, ``q_offset`` and GQA. Values: fp32 against the float64
oracle at rtol = atol = 1e-5. Gradients: ``jax.vjp`` of the implementation against central
finite differences of the oracle (float64) on tiny shapes, atol 1e-4.

Blockwise and pallas (interpret mode on CPU) run with blocks of 2 and 4 so that the 5..16
long sequences span several query and key blocks: ragged edges, block skipping (causal,
window, the global-token blocks apart from the band) and masked-vs-unmasked blocks all
take part.
"""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import kernels
from tfmjax.kernels import blockwise, pallas_attention
from tfmjax.kernels.masks import RandomBlocks

_spec = importlib.util.spec_from_file_location(
    "tfmjax_tests_oracle", pathlib.Path(__file__).resolve().parents[1] / "oracle.py"
)
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)

RTOL = ATOL = 1e-5  # fp32 values against the float64 oracle
GRAD_ATOL = 1e-4  # fp32 gradients against float64 central differences
FD_EPS = 1e-5

IMPLS = ("reference", "xla", "blockwise", "pallas")
SLOPES = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)  # ALiBi slopes for N=4

_BLOCKWISE_SMALL = blockwise.BlockSizes(
    block_q=4, block_k=4, block_q_bwd=2, block_k_bwd=4, kv_heads_per_step=1
)
_PALLAS_SMALL = pallas_attention.BlockSizes(4, 4, 2, 4, 4, 2)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 2 and 4 for blockwise and pallas when called through the entry point."""
    monkeypatch.setattr(blockwise, "BlockSizes", lambda: _BLOCKWISE_SMALL)
    monkeypatch.setattr(
        pallas_attention.BlockSizes,
        "for_platform",
        classmethod(lambda cls, platform, head_dim=64: _PALLAS_SMALL),
    )


def seg(rows):
    """``[B, L]`` int32 segment ids from one list per row."""
    return np.array(rows, np.int32)


# name: (T, S, K, options). B=2, N=4, H=4 throughout.
CASES = {
    "plain_mha": (5, 8, 4, {}),
    "plain_t_gt_s_mqa": (8, 5, 1, {}),
    "causal_gqa2": (8, 8, 2, dict(causal=True)),
    "causal_ragged_mqa": (5, 5, 1, dict(causal=True)),
    "causal_t_lt_s": (5, 8, 4, dict(causal=True)),
    "decode_t1_end": (1, 8, 2, dict(causal=True, q_offset=7)),
    "decode_t1_middle": (1, 8, 4, dict(causal=True, q_offset=4)),
    "decode_t3_end": (3, 8, 2, dict(causal=True, q_offset=5)),
    "decode_t3_middle": (3, 8, 1, dict(causal=True, q_offset=2)),
    "window0": (8, 8, 2, dict(window=0)),
    "window1": (8, 8, 2, dict(window=1)),
    "window2_t_lt_s": (5, 8, 4, dict(window=2)),
    "causal_window0": (8, 8, 1, dict(causal=True, window=0)),
    "causal_window1": (8, 8, 2, dict(causal=True, window=1)),
    "causal_window2": (5, 8, 4, dict(causal=True, window=2)),
    "decode_t3_window2": (3, 8, 2, dict(causal=True, window=2, q_offset=4)),
    "window1_q_offset_bidirectional": (3, 8, 4, dict(window=1, q_offset=3)),
    # Queries at 6..8, window 0: the one at 8 has no key 8, so its row is empty (zeros).
    "decode_empty_row": (3, 8, 2, dict(causal=True, window=0, q_offset=6)),
    "segments_padding": (
        5,
        8,
        2,
        dict(
            q_segment_ids=seg([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
            kv_segment_ids=seg([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8]),
        ),
    ),
    "segments_packing_causal": (
        8,
        8,
        1,
        dict(
            causal=True,
            q_segment_ids=seg([[1, 1, 1, 2, 2, 2, 2, 3], [4, 4, 4, 4, 4, 5, 5, 0]]),
            kv_segment_ids=seg([[1, 1, 1, 2, 2, 2, 2, 3], [4, 4, 4, 4, 4, 5, 5, 0]]),
        ),
    ),
    # Query segment 3 has no key at all: an empty row.
    "segments_cross_empty_row": (
        5,
        8,
        4,
        dict(
            q_segment_ids=seg([[1, 2, 3, 1, 2], [0, 7, 7, 7, 0]]),
            kv_segment_ids=seg([[0, 1, 1, 2, 2, 1, 0, 0], [7, 0, 0, 7, 7, 7, 7, 7]]),
        ),
    ),
    "alibi": (5, 8, 4, dict(alibi_slopes=SLOPES)),
    "alibi_causal_gqa2": (8, 8, 2, dict(causal=True, alibi_slopes=SLOPES)),
    "alibi_decode_t3": (3, 8, 1, dict(causal=True, alibi_slopes=SLOPES, q_offset=5)),
    "everything": (
        8,
        8,
        2,
        dict(
            causal=True,
            window=2,
            alibi_slopes=SLOPES,
            q_segment_ids=seg([[1, 1, 1, 1, 1, 2, 2, 2], [3, 3, 3, 3, 3, 3, 0, 0]]),
            kv_segment_ids=seg([[1, 1, 1, 1, 1, 2, 2, 2], [3, 3, 3, 3, 3, 3, 0, 0]]),
            scale=0.3,
        ),
    ),
    # Sparse patterns (masks.py): strided (Child et al. 2019), global tokens (Beltagy et al.
    # 2020). With 16 keys in blocks of 4, "global1_window1_causal" skips key block 1 for
    # the last query blocks (band: blocks 2-3, global keys: block 0).
    "stride3_causal": (12, 12, 2, dict(causal=True, stride=3)),
    "stride4_bidirectional_t_lt_s": (6, 12, 4, dict(stride=4)),
    "stride3_window1_causal_mqa": (12, 12, 1, dict(causal=True, stride=3, window=1)),
    "stride4_window0_bidirectional": (8, 12, 2, dict(stride=4, window=0)),
    "global2_without_pattern": (8, 8, 2, dict(causal=True, global_tokens=2)),
    "global1_window1_causal": (16, 16, 2, dict(causal=True, window=1, global_tokens=1)),
    "global3_window1_bidirectional": (12, 12, 4, dict(window=1, global_tokens=3)),
    "global2_stride4_causal": (12, 12, 2, dict(causal=True, stride=4, global_tokens=2)),
    "global2_stride5_bidirectional_mqa": (12, 12, 1, dict(stride=5, global_tokens=2)),
    "stride3_segments_padding": (
        10,
        12,
        2,
        dict(
            stride=3,
            q_segment_ids=seg([[1] * 7 + [0] * 3, [1] * 10]),
            kv_segment_ids=seg([[1] * 9 + [0] * 3, [1] * 12]),
        ),
    ),
    # Global tokens 0, 1 are in segment 1 (row 0) and 3 (row 1): segment 2 never sees them.
    "global2_window1_segments_packing_causal": (
        12,
        12,
        2,
        dict(
            causal=True,
            window=1,
            global_tokens=2,
            q_segment_ids=seg([[1] * 5 + [2] * 6 + [0], [3] * 8 + [4] * 4]),
            kv_segment_ids=seg([[1] * 5 + [2] * 6 + [0], [3] * 8 + [4] * 4]),
        ),
    ),
    "decode_t1_stride4": (1, 16, 2, dict(causal=True, stride=4, q_offset=13)),
    "decode_t3_global2_window2": (
        3,
        16,
        2,
        dict(causal=True, window=2, global_tokens=2, q_offset=10),
    ),
    # Queries at 1, 2 are global (see every earlier key), the one at 3 is not.
    "decode_t3_global_queries": (
        3,
        12,
        1,
        dict(causal=True, window=1, global_tokens=3, q_offset=1),
    ),
    "q_offset_bidirectional_sparse": (
        3,
        12,
        4,
        dict(window=1, stride=5, global_tokens=1, q_offset=4),
    ),
    "sparse_everything": (
        12,
        12,
        2,
        dict(
            causal=True,
            window=1,
            stride=4,
            global_tokens=2,
            alibi_slopes=SLOPES,
            q_segment_ids=seg([[1] * 9 + [2] * 3, [3] * 10 + [0] * 2]),
            kv_segment_ids=seg([[1] * 9 + [2] * 3, [3] * 10 + [0] * 2]),
            scale=0.3,
        ),
    ),
    # BigBird (Zaheer et al. 2020): window + global + random blocks. With blocks of 4, the
    # random key blocks of the later query blocks lie outside the band and the global block,
    # so the kernels visit them as candidates (and skip the others).
    "bigbird_causal": (
        16,
        16,
        2,
        dict(causal=True, window=1, global_tokens=1, random_blocks=RandomBlocks(1, 4, seed=3)),
    ),
    "bigbird_size2_bidirectional_t_lt_s": (
        12,
        16,
        2,
        dict(window=1, global_tokens=1, random_blocks=RandomBlocks(2, 2, seed=0, num_blocks=8)),
    ),
    "bigbird_stride5_decode_t3": (
        3,
        16,
        2,
        dict(causal=True, stride=5, random_blocks=RandomBlocks(2, 4, seed=1), q_offset=12),
    ),
    "random_without_pattern": (8, 8, 2, dict(causal=True, random_blocks=RandomBlocks(1, 2))),
    "bigbird_segments_alibi_mqa": (
        12,
        12,
        1,
        dict(
            causal=True,
            window=0,
            random_blocks=RandomBlocks(2, 2, seed=5),
            alibi_slopes=SLOPES,
            q_segment_ids=seg([[1] * 9 + [2] * 3, [3] * 10 + [0] * 2]),
            kv_segment_ids=seg([[1] * 9 + [2] * 3, [3] * 10 + [0] * 2]),
        ),
    ),
}

# The reference runs every case; the other paths a subset by default (each case is a fresh
# compile, ~1 s for blockwise and pallas-interpret on a busy 2-core CPU), the rest are slow.
QUICK = {
    "xla": {
        "plain_t_gt_s_mqa",
        "causal_gqa2",
        "causal_ragged_mqa",
        "decode_t1_middle",
        "decode_t3_end",
        "window0",
        "causal_window1",
        "window2_t_lt_s",
        "decode_t3_window2",
        "window1_q_offset_bidirectional",
        "decode_empty_row",
        "segments_padding",
        "segments_packing_causal",
        "alibi_decode_t3",
        "everything",
    },
    "pallas": {
        "causal_gqa2",
        "causal_ragged_mqa",
        "decode_t3_middle",
        "window1",
        "causal_window2",
        "decode_empty_row",
        "segments_cross_empty_row",
        "everything",
    },
}
QUICK["reference"] = set(CASES)
QUICK["xla"] |= {
    "stride3_causal",
    "stride4_bidirectional_t_lt_s",
    "stride3_window1_causal_mqa",
    "global1_window1_causal",
    "global3_window1_bidirectional",
    "global2_stride5_bidirectional_mqa",
    "stride3_segments_padding",
    "decode_t1_stride4",
    "decode_t3_global_queries",
    "q_offset_bidirectional_sparse",
    "sparse_everything",
}
QUICK["xla"] |= {"bigbird_causal", "bigbird_stride5_decode_t3", "bigbird_segments_alibi_mqa"}
QUICK["blockwise"] = QUICK["xla"] | {"bigbird_size2_bidirectional_t_lt_s"}
QUICK["pallas"] |= {
    "bigbird_causal",
    "bigbird_size2_bidirectional_t_lt_s",
    "bigbird_segments_alibi_mqa",
    "stride3_causal",
    "global1_window1_causal",
    "global3_window1_bidirectional",
    "global2_window1_segments_packing_causal",
    "decode_t3_global_queries",
    "sparse_everything",
}


def inputs(B, T, S, N, K, H, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((B, T, N, H)).astype(dtype),
        rng.standard_normal((B, S, K, H)).astype(dtype),
        rng.standard_normal((B, S, K, H)).astype(dtype),
    )


def jax_kwargs(options):
    return {
        name: (jnp.asarray(value) if isinstance(value, np.ndarray) else value)
        for name, value in options.items()
    }


def value_params():
    for impl in IMPLS:
        for name in CASES:
            marks = ()
            if name not in QUICK[impl]:
                marks = (pytest.mark.slow,)
            yield pytest.param(impl, name, id=f"{impl}-{name}", marks=marks)


@pytest.mark.parametrize("impl, name", list(value_params()))
def test_values_match_oracle(impl, name):
    T, S, K, options = CASES[name]
    q, k, v = inputs(2, T, S, 4, K, 4, seed=len(name))
    want = oracle.oracle_attention(q, k, v, **options)
    got = jax.jit(lambda q, k, v: kernels.attention(q, k, v, impl=impl, **jax_kwargs(options)))(
        q, k, v
    )
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["spread", "all_negative"])
def test_large_logits_stay_finite(impl, sign):
    """Scores of a few hundred overflow (or underflow) exp() in fp32: every path must
    subtract the row maximum. ``spread``: scores of both signs up to ~+-300;
    ``all_negative``: every score of a row below -100, so a path that started its running
    maximum anywhere but far below sees ``exp()`` underflow to an all-zero row.

    The float64 oracle has room up to ~700, so it needs no such care to be exact here.
    """
    q, k, v = inputs(2, 5, 8, 4, 2, 4, seed=11)
    if sign > 0:
        q = q * 60.0
    else:  # keys anti-aligned with every query, plus noise of a few units of score
        q = np.broadcast_to(np.abs(q[:1, :1, :1]), q.shape) * 10.0
        k = k - np.abs(q[:, :1, :2])
    scores = np.einsum("btnh,bskh->bnts", q[:, :, ::2], k) / 2.0  # heads 0, 2 vs kv heads
    if sign > 0:
        assert np.abs(scores).max() > 200  # far past fp32's exp() limit of ~88
    else:
        assert scores.max() < -100 and np.ptp(scores, axis=-1).min() > 1
    want = oracle.oracle_attention(q, k, v, causal=True)
    got = jax.jit(lambda q, k, v: kernels.attention(q, k, v, impl=impl, causal=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL)


def test_dense_mask_defaults_to_no_offset():
    """``dense_mask`` without ``q_offset`` puts query t at position t (prefill, training)."""
    from tfmjax.kernels.masks import dense_mask

    for causal, window, stride, g in [
        (True, None, None, 0),
        (False, 1, None, 0),
        (True, 2, None, 0),
        (True, None, 2, 0),
        (False, 0, 3, 1),
        (False, 1, None, 2),
    ]:
        pattern = dict(causal=causal, window=window, stride=stride, global_tokens=g)
        got = np.asarray(dense_mask(4, 6, **pattern))[0, 0]
        want = [[oracle.oracle_visible(t, s, **pattern) for s in range(6)] for t in range(4)]
        np.testing.assert_array_equal(got, np.array(want), err_msg=str(pattern))


def test_oracle_empty_rows_are_zero():
    """The cases meant to have empty rows do have them (else they test nothing)."""
    for name in ("decode_empty_row", "segments_cross_empty_row"):
        T, S, K, options = CASES[name]
        out = oracle.oracle_attention(*inputs(2, T, S, 4, K, 4), **options)
        assert np.any(np.all(out == 0, axis=(2, 3))), name


BIAS_SHAPES = {
    "full": (2, 4),
    "batch_broadcast": (1, 4),
    "head_broadcast": (2, 1),
}


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("bias_shape", list(BIAS_SHAPES), ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_dense_bias_matches_oracle(impl, bias_shape, causal):
    T, S, K = 5, 8, 2
    q, k, v = inputs(2, T, S, 4, K, 4, seed=3)
    bias = np.random.default_rng(4).standard_normal(BIAS_SHAPES[bias_shape] + (T, S))
    bias = bias.astype(np.float32)
    options = dict(causal=causal, bias=bias, alibi_slopes=SLOPES, window=3)
    want = oracle.oracle_attention(q, k, v, **options)
    got = kernels.attention(q, k, v, impl=impl, **jax_kwargs(options))
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL)


# Gradients: name: (T, S, N, K, options), B=1, H=2.
GRAD_CASES = {
    "causal_gqa2": (4, 4, 2, 1, dict(causal=True)),
    "window1_alibi": (4, 4, 2, 2, dict(window=1, alibi_slopes=SLOPES[:2])),
    "decode_causal_window1": (3, 4, 2, 1, dict(causal=True, window=1, q_offset=1)),
    "segments_packing_causal_empty_row": (
        4,
        4,
        2,
        2,
        dict(
            causal=True,
            q_segment_ids=seg([[1, 1, 2, 0]]),
            kv_segment_ids=seg([[1, 1, 2, 2]]),
        ),
    ),
    "stride3_causal": (8, 8, 2, 1, dict(causal=True, stride=3)),
    # Queries 12..15 need key blocks 2-3 (band) and 0 (global key 0), not block 1.
    "decode_global1_window1_causal": (
        4,
        16,
        2,
        1,
        dict(causal=True, window=1, global_tokens=1, q_offset=12),
    ),
    "global1_stride4_window0_bidirectional": (
        8,
        8,
        2,
        2,
        dict(stride=4, window=0, global_tokens=1),
    ),
    "decode_stride3_segments": (
        3,
        8,
        2,
        1,
        dict(
            causal=True,
            stride=3,
            q_offset=5,
            q_segment_ids=seg([[1, 1, 2]]),
            kv_segment_ids=seg([[1, 1, 1, 1, 1, 1, 2, 2]]),
        ),
    ),
    "sparse_everything": (
        6,
        8,
        2,
        1,
        dict(causal=True, window=1, stride=3, global_tokens=1, alibi_slopes=SLOPES[:2]),
    ),
    # Random key blocks of 2 outside the band: visited as candidates in both orientations.
    "bigbird_causal": (
        12,
        12,
        2,
        1,
        dict(causal=True, window=0, global_tokens=1, random_blocks=RandomBlocks(2, 2, seed=4)),
    ),
}
GRAD_IMPLS = ("xla", "blockwise", "pallas")
# Sparse-pattern gradient cases xla runs by default (its gradient is autodiff of the dense
# mask; the others are slow for it).
GRAD_QUICK_XLA = {
    "bigbird_causal",
    "causal_gqa2",
    "window1_alibi",
    "decode_causal_window1",
    "segments_packing_causal_empty_row",
    "sparse_everything",
}


def finite_difference_grads(f, arrays, eps=FD_EPS):
    """Central differences of the scalar ``f(*arrays)`` w.r.t. every element of each array."""
    grads = []
    for i, x in enumerate(arrays):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = (f(*plus) - f(*minus)) / (2 * eps)
        grads.append(g)
    return grads


def grad_params():
    for name in GRAD_CASES:
        for impl in GRAD_IMPLS:
            slow = impl == "xla" and name not in GRAD_QUICK_XLA
            yield pytest.param(
                name, impl, id=f"{name}-{impl}", marks=(pytest.mark.slow,) if slow else ()
            )


@pytest.mark.parametrize("name, impl", list(grad_params()))
def test_grads_match_oracle_finite_differences(name, impl):
    T, S, N, K, options = GRAD_CASES[name]
    q, k, v = inputs(1, T, S, N, K, 2, seed=7, dtype=np.float64)
    d_out = np.random.default_rng(8).standard_normal((1, T, N, 2))

    def oracle_loss(q, k, v):
        return float(np.sum(oracle.oracle_attention(q, k, v, **options) * d_out))

    want = finite_difference_grads(oracle_loss, [q, k, v])
    kw = jax_kwargs(options)
    d_out32 = jnp.asarray(d_out, jnp.float32)
    loss = lambda q, k, v: jnp.sum(kernels.attention(q, k, v, impl=impl, **kw) * d_out32)
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(
        *(jnp.asarray(x, jnp.float32) for x in (q, k, v))
    )
    for label, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=0, atol=GRAD_ATOL, err_msg=label)


def test_small_blocks_are_in_use():
    """The fixture really shrinks the blocks the entry point uses (so several blocks run)."""
    assert blockwise.BlockSizes() is _BLOCKWISE_SMALL
    assert pallas_attention.BlockSizes.for_platform("cpu") is _PALLAS_SMALL


def test_oracle_mask_rules_by_hand():
    """The oracle's visibility rule on a few hand-checked pairs."""
    vis = oracle.oracle_visible
    assert vis(3, 3, causal=True, window=0) and not vis(3, 4, causal=True, window=None)
    assert vis(3, 1, causal=True, window=2) and not vis(3, 0, causal=True, window=2)
    assert vis(3, 5, causal=False, window=2) and not vis(3, 6, causal=False, window=2)
    assert not vis(0, 0, causal=False, window=None, q_seg=0, kv_seg=0)
    assert not vis(0, 0, causal=False, window=None, q_seg=1, kv_seg=2)
    assert vis(0, 0, causal=False, window=None, q_seg=2, kv_seg=2)
    # Strided: |d| < stride, or d a multiple of stride (either sign when not causal).
    assert vis(9, 6, causal=True, window=None, stride=4) and vis(
        9, 1, causal=True, window=None, stride=4
    )
    assert not vis(9, 4, causal=True, window=None, stride=4)
    assert vis(1, 9, causal=False, window=None, stride=4) and not vis(
        1, 8, causal=False, window=None, stride=4
    )
    assert vis(9, 5, causal=True, window=0, stride=4) and not vis(
        9, 8, causal=True, window=0, stride=4
    )
    # Global tokens override the pattern, not causality or segments.
    assert vis(9, 0, causal=True, window=1, global_tokens=1)
    assert vis(0, 9, causal=False, window=1, global_tokens=1)
    assert not vis(0, 9, causal=True, window=1, global_tokens=1)
    assert not vis(9, 0, causal=True, window=1, global_tokens=1, q_seg=1, kv_seg=2)
