"""The sparse attention patterns of ``tfmjax.kernels.masks``: strided (Sparse Transformer,
Child et al. 2019), global tokens (Longformer, Beltagy et al. 2020) and random blocks
(BigBird, Zaheer et al. 2020).

* The masks are the papers' drawings: rows of small masks, written out by hand, against
  both ``masks.dense_mask`` and the independent NumPy oracle's rule.
* Block skipping: the block ranges of ``block_geometry.pattern_ranges`` (shared by the
  blockwise path and the Pallas kernels, in both orientations) never drop a block that
  holds a visible pair, and leave unmasked only blocks whose pairs are all visible;
  window-only ranges are exactly those of ``block_range``; global tokens keep skipping;
  random blocks are visited as candidates only where they hold a random pair.
* A traced ``q_offset`` (decoding) against the oracle, and one-line errors for bad options.

Values and gradients of every implementation against the oracle are in ``test_oracle.py``.
"""

import importlib.util
import itertools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import kernels
from tfmjax.compat import gpu_lowering_target, triton_custom_call_target
from tfmjax.kernels import (
    block_geometry,
    blockwise,
    blockwise_layout,
    masks,
    pallas_attention,
    pallas_kernels,
)
from tfmjax.kernels.masks import RandomBlocks

_spec = importlib.util.spec_from_file_location(
    "tfmjax_tests_oracle", pathlib.Path(__file__).resolve().parents[1] / "oracle.py"
)
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)


def mask_rows(T, S, rows, **pattern):
    """``{p: set of keys}`` for the query rows ``rows`` of masks.dense_mask and the oracle
    (they must agree)."""
    dense = np.asarray(masks.dense_mask(T, S, **pattern))[0, 0]
    got = {}
    for p in rows:
        from_mask = set(np.flatnonzero(dense[p]).tolist())
        from_oracle = {s for s in range(S) if oracle.oracle_visible(p, s, **pattern)}
        assert from_mask == from_oracle, (p, from_mask, from_oracle)
        got[p] = from_mask
    return got


def test_strided_causal_rows_as_drawn():
    """Child et al. 2019, strided attention with l = 4: the previous 3 positions and the
    position itself (local), and every 4th position before (strided)."""
    rows = mask_rows(16, 16, [0, 3, 4, 9, 15], causal=True, window=None, stride=4)
    assert rows[0] == {0}
    assert rows[3] == {0, 1, 2, 3}
    assert rows[4] == {0, 1, 2, 3, 4}  # d = 4 is strided
    assert rows[9] == {9, 8, 7, 6} | {5, 1}  # local d < 4; strided d = 4, 8
    assert rows[15] == {15, 14, 13, 12} | {11, 7, 3}


def test_strided_bidirectional_and_window_rows():
    """Without causality the pattern is symmetric (floor modulo: d = -4 is strided too);
    a window replaces the local part ``|d| < stride`` by ``|d| <= window``."""
    rows = mask_rows(16, 16, [9], causal=False, window=None, stride=4)
    assert rows[9] == set(range(6, 13)) | {1, 5, 13}
    rows = mask_rows(16, 16, [9, 2], causal=True, window=1, stride=4)
    assert rows[9] == {9, 8} | {5, 1}
    assert rows[2] == {2, 1}
    rows = mask_rows(16, 16, [6], causal=False, window=0, stride=3)
    assert rows[6] == {0, 3, 6, 9, 12, 15}
    rows = mask_rows(8, 8, [5], causal=True, window=None, stride=1)  # l = 1: everything
    assert rows[5] == set(range(6))


def test_global_rows_as_drawn():
    """Beltagy et al. 2020, sliding window plus global attention on the first 2 tokens:
    the global rows see every key, every row sees the global keys; causality and segment
    ids still apply."""
    rows = mask_rows(16, 16, [0, 1, 2, 9], causal=False, window=1, global_tokens=2)
    assert rows[0] == rows[1] == set(range(16))
    assert rows[2] == {0, 1, 2, 3}
    assert rows[9] == {0, 1} | {8, 9, 10}
    rows = mask_rows(16, 16, [1, 9], causal=True, window=1, global_tokens=2)
    assert rows[1] == {0, 1}
    assert rows[9] == {0, 1} | {8, 9}
    rows = mask_rows(16, 16, [9], causal=True, window=0, stride=4, global_tokens=1)
    assert rows[9] == {0} | {9, 5, 1}
    # Without a window or stride there is nothing to override: global tokens change nothing.
    rows = mask_rows(8, 8, [5], causal=True, window=None, global_tokens=2)
    assert rows[5] == set(range(6))
    # Segments: the global token 0 is in segment 1, the query at 5 in segment 2.
    seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 2]])
    dense = masks.dense_mask(
        8, 8, causal=True, window=1, global_tokens=1, q_segment_ids=seg, kv_segment_ids=seg
    )
    assert set(np.flatnonzero(np.asarray(dense)[0, 0, 5]).tolist()) == {4, 5}
    assert set(np.flatnonzero(np.asarray(dense)[0, 0, 2]).tolist()) == {0, 1, 2}


def test_global_queries_counted_from_q_offset():
    """A query is global by its absolute position ``q_offset + t``, a key by its slot."""
    dense = np.asarray(masks.dense_mask(2, 8, causal=True, window=0, global_tokens=2, q_offset=1))
    assert set(np.flatnonzero(dense[0, 0, 0]).tolist()) == {0, 1}  # p = 1: global
    assert set(np.flatnonzero(dense[0, 0, 1]).tolist()) == {0, 1, 2}  # p = 2: sees globals


def test_random_block_rows_as_drawn():
    """BigBird's random attention: every query of a block sees the same random key blocks,
    whole blocks, at most ``count`` of them; causal draws lie before the query's block and
    block 0 draws none; other seeds draw other blocks; without a window or stride random
    blocks change nothing (as global tokens)."""
    rb = RandomBlocks(2, 4, seed=7)
    pattern = dict(causal=True, window=0, random_blocks=rb)
    rows = mask_rows(64, 64, range(64), **pattern)
    for block in range(16):
        extra = [rows[p] - {p} for p in range(4 * block, 4 * block + 4)]
        assert all(e == extra[0] for e in extra), block  # the same keys for the whole block
        blocks = {s // 4 for s in extra[0]}
        assert extra[0] == {4 * b + i for b in blocks for i in range(4)}  # whole blocks
        assert len(blocks) <= 2 and all(b < block for b in blocks), (block, blocks)
        assert (block == 0) == (not blocks)
    other = mask_rows(64, 64, range(64), causal=True, window=0, random_blocks=RandomBlocks(2, 4))
    assert other != rows
    rows = mask_rows(
        16, 16, range(16), causal=False, window=1, random_blocks=RandomBlocks(1, 4, 0, 4)
    )
    for p in range(16):  # bidirectional: one other block, from all four
        random = rows[p] - set(range(p - 1, p + 2))
        assert len({s // 4 for s in random}) <= 1 and p // 4 not in {s // 4 for s in random}
    assert mask_rows(8, 8, [5], causal=True, window=None, random_blocks=rb)[5] == set(range(6))


# ----------------------------------------------------------------------------------------
# Block ranges, both orientations, against brute force.

PATTERNS = [
    dict(causal=causal, window=window, stride=stride, global_tokens=g)
    for causal, (window, stride), g in itertools.product(
        (False, True),
        [(None, None), (2, None), (None, 3), (1, 4), (0, 5), (None, 1)],
        (0, 1, 5),
    )
]
PATTERNS += [  # BigBird: random blocks of 1, 2 or 3 positions, with and without global tokens
    dict(causal=causal, window=window, stride=stride, global_tokens=g, random_blocks=rb)
    for causal, (window, stride), g, rb in itertools.product(
        (False, True),
        [(0, None), (2, None), (None, 4)],
        (0, 2),
        [RandomBlocks(2, 1, seed=1, num_blocks=19), RandomBlocks(1, 3, seed=2, num_blocks=7)],
    )
]


def visits(ranges, n):
    """``[n]`` ints of a BlockRanges (its ``random`` evaluated: see :func:`candidates`): 0 not
    visited, 1 visited masked, 2 unmasked; checks the ranges are ordered and disjoint."""
    glo, ghi, lo, flo, fhi, hi = (None if x is None else int(x) for x in ranges[:6])
    assert 0 <= lo <= flo <= fhi <= hi <= n, ranges
    out = np.zeros(n, int)
    if glo is not None:
        assert 0 <= glo and ghi <= lo, ranges
        out[glo:ghi] = 1
    out[lo:flo] = out[fhi:hi] = 1
    out[flo:fhi] = 2
    if ranges.random is not None:
        rlo, rhi = int(ranges.rlo), int(ranges.rhi)
        assert 0 <= rlo <= lo and (ghi is None or rlo == ghi) and hi <= rhi <= n, ranges
        for j in [*range(rlo, lo), *range(hi, rhi)]:
            out[j] = int(ranges.random[j])
    return out


def candidates(ranges, n):
    """The BlockRanges with ``random`` evaluated on every other-axis block (``[n]`` bools)."""
    if ranges.random is None:
        return ranges
    return ranges._replace(random=jnp.stack([ranges.random(jnp.int32(j)) for j in range(n)]))


def check_ranges(ranges_fn, visible, block_a, block, num_blocks, label):
    """``ranges_fn(j)``: the BlockRanges of block ``j`` of this axis; ``visible[a, x]``:
    whether position ``a`` of this axis sees position ``x`` of the other (both from 0)."""
    num_a = visible.shape[0] // block_a
    all_ranges = jax.vmap(lambda j: candidates(ranges_fn(j), num_blocks))(
        jnp.arange(num_a, dtype=jnp.int32)
    )
    for j in range(num_a):
        got = visits(jax.tree.map(lambda x, j=j: x[j], all_ranges), num_blocks)
        for b in range(num_blocks):
            pairs = visible[j * block_a : (j + 1) * block_a, b * block : (b + 1) * block]
            where = f"{label}, block {j}, other block {b}: {got}"
            assert got[b] or not pairs.any(), "skipped a needed block: " + where
            assert got[b] != 2 or pairs.all(), "unmasked a block with masked pairs: " + where


def pattern_id(pattern):
    rb = pattern.get("random_blocks")
    rest = {k: v for k, v in pattern.items() if k != "random_blocks"}
    return str(rest) + ("" if rb is None else f"-random{rb.count}x{rb.size}")


@pytest.mark.parametrize("pattern", PATTERNS, ids=pattern_id)
def test_block_ranges_cover_the_pattern(pattern):
    """Every block holding a visible pair is visited (so skipping never drops work) and
    every unmasked block holds only visible pairs: key blocks per query block (blockwise
    forward and backward, Pallas forward and dQ) and query blocks per key block (Pallas
    dK/dV). Keys are padded from S=19 up to the blocks (padding is never visible); queries
    start at ``q_offset``."""
    T, S = 13, 19
    for bq, bk, offset in [(4, 2, 0), (2, 4, 6)]:
        nq, nk = -(-T // bq), -(-S // bk)
        st = pallas_kernels.KernelStatic(
            **pattern,
            scale=1.0,
            q_len=T,
            kv_len=S,
            static_offset=offset,
            has_seg=False,
            has_alibi=False,
            groups=1,
            blocks=None,
            platform="cpu",
        )
        visible = np.array(
            [
                [s < S and oracle.oracle_visible(offset + t, s, **pattern) for s in range(nk * bk)]
                for t in range(nq * bq)
            ]
        )
        label = f"{pattern} {offset=} {bq=} {bk=}"
        check_ranges(
            lambda i, st=st, bq=bq, bk=bk, nk=nk: pallas_kernels._key_ranges(
                st, i * bq, bq, bk, nk
            ),
            visible,
            bq,
            bk,
            nk,
            label + " key ranges",
        )
        check_ranges(
            lambda j, st=st, bq=bq, bk=bk, nq=nq: pallas_kernels._query_ranges(
                st, j * bk, bq, bk, nq
            ),
            visible.T,
            bk,
            bq,
            nq,
            label + " query ranges",
        )


@pytest.mark.parametrize("traced", [False, True], ids=["static_offset", "traced_offset"])
def test_blockwise_ranges_are_the_key_ranges(traced):
    """blockwise's per-query-block ranges are pattern_ranges' too (also with a traced
    ``q_offset``, where they stay tight)."""
    pattern = dict(causal=True, window=1, stride=None, global_tokens=2)
    st = blockwise_layout.BlockwiseStatic(
        **pattern, scale=1.0, q_len=16, kv_len=32, blocks=blockwise.BlockSizes()
    )
    geo = blockwise_layout.PassGeometry.make(st, 4, 4, K=1, G=1)

    def ranges(offset):
        scores = blockwise_layout.BlockScores(geo, offset, None, None, None, prescaled=True)
        return jax.vmap(scores.ranges)(jnp.arange(geo.nq))

    offset = jnp.int32(12)
    got = jax.jit(ranges)(offset) if traced else ranges(offset)
    # Queries 24..27 (block 3): global key block 0 and the band, blocks 5-6.
    assert visits(jax.tree.map(lambda x: x[3], got), 8).tolist() == [1, 0, 0, 0, 0, 1, 1, 0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 0, 3])
def test_window_only_ranges_are_block_range(causal, window):
    """Without stride or global tokens, pattern_ranges is block_range's (exact) band and
    adds no global range; global tokens without a window or stride change nothing."""
    dmin, dmax = block_geometry.distance_bounds(causal, window)
    for g, a_lo in itertools.product((0, 3), range(0, 30, 5)):
        got = block_geometry.pattern_ranges(
            a_lo,
            a_lo + 3,
            4,
            8,
            causal=causal,
            window=window,
            stride=None,
            global_tokens=g if window is None else 0,
            num_full=7,
        )
        want = block_geometry.block_range(a_lo, a_lo + 3, 4, 8, dmin, dmax, num_full=7)
        assert got.glo is None and got.ghi is None
        assert [int(x) for x in got[2:6]] == [int(x) for x in want]
        assert got.random is None


def test_global_tokens_keep_skipping():
    """Window 1 plus one global token over 32 keys in blocks of 4: queries 28..31 visit key
    block 0 (the global key) and blocks 6-7 (the band), nothing in between; the query
    block holding the global query visits everything."""
    pattern = dict(causal=True, window=1, stride=None, global_tokens=1)
    late = block_geometry.pattern_ranges(28, 31, 4, 8, **pattern, num_full=8)
    assert visits(late, 8).tolist() == [1, 0, 0, 0, 0, 0, 1, 1]
    first = block_geometry.pattern_ranges(0, 3, 4, 8, **pattern, num_full=8)
    assert visits(first, 8).tolist() == [1, 0, 0, 0, 0, 0, 0, 0]  # causal: keys 0..3
    bidirectional = block_geometry.pattern_ranges(
        0, 3, 4, 8, **dict(pattern, causal=False), num_full=8
    )
    assert visits(bidirectional, 8).all()
    # A stride reaches keys at any distance: the whole causal range, unmasked only where
    # every pair is local (keys 24..27: d = 1..7 < 8).
    strided = block_geometry.pattern_ranges(
        28, 31, 4, 8, causal=True, window=None, stride=8, global_tokens=0, num_full=8
    )
    assert visits(strided, 8).tolist() == [1, 1, 1, 1, 1, 1, 2, 1]


def test_random_blocks_keep_skipping():
    """Window 0 with one random key block per query block of 4, over 64 keys in blocks of 4:
    a late query block visits its own block and at most its random one, not the other 14."""
    rb = RandomBlocks(1, 4, seed=3)
    pattern = dict(causal=True, window=0, stride=None, global_tokens=0, random_blocks=rb)

    def ranges_and_target(i):
        ranges = block_geometry.pattern_ranges(4 * i, 4 * i + 3, 4, 16, **pattern, num_full=16)
        return candidates(ranges, 16), masks.random_key_block(rb, i, 0, causal=True)

    every = jax.jit(jax.vmap(ranges_and_target))(jnp.arange(16, dtype=jnp.int32))
    for i in range(1, 16):
        ranges, target = jax.tree.map(lambda x, i=i: x[i], every)
        got, target = visits(ranges, 16), int(target)
        want = np.zeros(16, int)
        want[target] = 1
        want[i] = 1  # own block: the diagonal, masked
        assert got.tolist() == want.tolist(), (i, target)


# ----------------------------------------------------------------------------------------
# Through the entry point.


@pytest.mark.parametrize("impl", ["blockwise", "pallas"])
def test_traced_q_offset_matches_oracle(impl):
    """Decoding with a traced ``q_offset``: blockwise keeps skipping with traced bounds,
    Pallas visits every block (masked)."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    k, v = (rng.standard_normal((1, 16, 2, 4)).astype(np.float32) for _ in range(2))
    pattern = dict(causal=True, window=1, stride=4, global_tokens=2)
    extra = {
        "blockwise": dict(block_sizes=blockwise.BlockSizes(4, 4, 2, 4)),
        "pallas": dict(block_sizes=pallas_attention.BlockSizes(4, 4, 2, 4, 4, 2), platform="cpu"),
    }[impl]
    fn = {"blockwise": blockwise.attention, "pallas": pallas_attention.attention}[impl]

    @jax.jit
    def run(q, k, v, offset):
        kw = dict(q_segment_ids=None, kv_segment_ids=None, alibi_slopes=None, bias=None)
        return fn(q, k, v, **pattern, **kw, q_offset=offset, scale=0.5, **extra)

    for offset in (2, 9, 13):
        want = oracle.oracle_attention(q, k, v, **pattern, q_offset=offset, scale=0.5)
        got = run(q, k, v, jnp.int32(offset))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(stride=0), r"stride=0 must be an int >= 1"),
        (dict(stride=-3), r"stride=-3 must be an int >= 1"),
        (dict(stride=2.5), r"stride=2.5 must be an int >= 1"),
        (dict(stride=True), r"stride=True must be an int >= 1"),
        (dict(global_tokens=-1), r"global_tokens=-1 must be an int >= 0"),
        (dict(global_tokens=1.5), r"global_tokens=1.5 must be an int >= 0"),
        (dict(global_tokens=None), r"global_tokens=None must be an int >= 0"),
        (dict(random_blocks=2), r"random_blocks=2 must be a tfmjax.kernels.masks.RandomBlocks"),
        (dict(random_blocks=RandomBlocks(1, 2)), r"random_blocks.num_blocks=0 leaves nothing"),
    ],
)
def test_bad_pattern_arguments_are_one_line(kwargs, message):
    q = jnp.zeros((1, 4, 2, 4))
    kv = jnp.zeros((1, 4, 2, 4))
    with pytest.raises(ValueError, match=message) as info:
        kernels.attention(q, kv, kv, impl="xla", **kwargs)
    assert "\n" not in str(info.value)


def test_numpy_integer_options_are_accepted():
    q = jnp.ones((1, 4, 2, 4))
    out = kernels.attention(q, q, q, stride=np.int64(2), global_tokens=np.int32(1), impl="xla")
    assert out.shape == q.shape


def test_auto_passes_the_pattern_to_every_platform():
    """``impl="auto"`` dispatches per platform (xla here, pallas on cuda/tpu): the eager
    call matches the oracle and the cuda lowering carries the Triton kernel."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 8, 2, 4)).astype(np.float32) for _ in range(3))
    pattern = dict(causal=True, window=1, stride=3, global_tokens=1)
    want = oracle.oracle_attention(q, k, v, **pattern)
    np.testing.assert_allclose(
        np.asarray(kernels.attention(q, k, v, **pattern, impl="auto")), want, rtol=1e-5, atol=1e-5
    )
    fn = jax.jit(lambda q, k, v: kernels.attention(q, k, v, **pattern, impl="auto"))
    with gpu_lowering_target():
        text = fn.trace(q, k, v).lower(lowering_platforms=("cuda",)).as_text()
    assert triton_custom_call_target() in text
