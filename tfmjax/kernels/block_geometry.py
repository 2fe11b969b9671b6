"""Block geometry shared by the blockwise and Pallas kernels: which blocks to visit, and masks.

Causal masks and sliding windows bound the distance ``d = p - s`` between a query position
``p`` and a key position ``s`` (:func:`distance_bounds`); :func:`block_range` turns that into
the range of blocks of the other axis that a block of this axis needs, and the sub-range it
sees entirely. Loops run only over the needed range (its bounds are traced scalars, so a
traced ``q_offset`` skips too), and only blocks on the edge of the range pay for building and
applying a mask (:func:`block_mask`, :func:`loop_over_ranges`).

:func:`pattern_ranges` adds the sparse patterns of :mod:`tfmjax.kernels.masks`: window-only
(and plain causal) masks skip exactly as :func:`block_range` says; a ``stride`` (Child et al.
2019) reaches keys at any distance, so the needed range is the causal one (all blocks up to
the diagonal, or all when not causal) and only blocks inside the local band are unmasked;
``global_tokens`` (Beltagy et al. 2020) add the key blocks holding ``s < g`` as a masked range
of their own before the band, and a query block holding ``p < g`` visits the whole causal
range. ``random_blocks`` (Zaheer et al. 2020) make the rest of the causal range candidates:
each is visited, masked, only when one of its pairs is a random pair
(:func:`tfmjax.kernels.masks.random_blocks_meet`), so empty blocks are skipped.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax

from tfmjax.kernels.masks import allowed, has_pattern, random_blocks_meet

# Masked scores are set to MASK_VALUE (finite: no inf - inf) and the running row max
# starts at ROW_MAX_INIT, far below any real score but far above MASK_VALUE. Then
# exp(MASK_VALUE - m) == 0 for every row, even one that has seen only masked entries so
# far (its m stays ROW_MAX_INIT), and no second select is needed after the exp; in the
# backward exp(MASK_VALUE - lse) == 0 as well (lse = +inf for rows that see nothing).
MASK_VALUE = -1e30
ROW_MAX_INIT = 0.5 * MASK_VALUE


def distance_bounds(causal: bool, window: int | None, stride: int | None = None):
    """Bounds ``(dmin, dmax)`` on ``d = p - s`` for a pair the causal rule and the
    window/stride pattern allow (None = unbounded); global tokens aside.

    The same rule as :func:`tfmjax.kernels.masks.allowed`: causal is ``s <= p`` (``d >=
    0``), a window is ``|d| <= window``. A stride allows ``d % stride == 0`` at any distance,
    so it bounds nothing beyond causality.
    """
    if stride is not None:
        return (0 if causal else None), None
    dmin = 0 if causal else (None if window is None else -window)
    dmax = None if window is None else window
    return dmin, dmax


def full_distance_bounds(causal: bool, window: int | None, stride: int | None = None):
    """Bounds ``(dmin, dmax)`` on ``d`` inside which every pair is allowed by the causal rule
    and the window/stride pattern (segments and padding aside). Without a stride, those of
    :func:`distance_bounds`; with one, the local band (``|d| < stride``, or ``|d| <=
    window`` with a window) -- or everything for ``stride == 1``, which divides every d."""
    if stride is None:
        return distance_bounds(causal, window)
    local = None if stride == 1 else (stride - 1 if window is None else window)
    return distance_bounds(causal, local)


def _transposed(bounds):
    """Bounds on ``-d`` from bounds on ``d``."""
    dmin, dmax = bounds
    return (None if dmax is None else -dmax), (None if dmin is None else -dmin)


def _floor_div(x, d: int):
    """``x // d`` for int32 ``x`` and a positive int ``d`` with only ops every Pallas
    backend lowers (``jnp.floor_divide`` needs ``sign``, which Mosaic TPU only lowers
    knowing the chip)."""
    quot = lax.div(x, jnp.int32(d))  # rounds towards zero
    return jnp.where(x - quot * d < 0, quot - 1, quot)


def block_range(
    a_lo,
    a_hi,
    block: int,
    num_blocks: int,
    dmin,
    dmax,
    *,
    num_full: int,
    full_ok: bool = True,
    full_bounds=None,
):
    """Which blocks of the other axis positions ``a_lo..a_hi`` of this axis need.

    The other axis has blocks ``b`` covering positions ``b*block .. b*block+block-1``;
    a pair is visible iff ``a - x`` lies in ``[dmin, dmax]``. Returns traced int32
    ``lo <= flo <= fhi <= hi``: blocks in ``[lo, hi)`` hold at least one visible pair,
    blocks in ``[flo, fhi)`` only visible pairs (so need no mask). ``num_full``: how many
    leading blocks hold no padding; ``full_ok=False`` (segment ids) marks every block
    as needing a mask. ``full_bounds``: ``(dmin, dmax)`` for ``[flo, fhi)`` when only a
    narrower band than ``[dmin, dmax]`` is entirely visible (default: ``[dmin, dmax]``).
    ``a_lo``, ``a_hi`` may be traced scalars.
    """
    div = _floor_div
    a_lo = jnp.asarray(a_lo, jnp.int32)
    a_hi = jnp.asarray(a_hi, jnp.int32)
    zero, top = jnp.int32(0), jnp.int32(num_blocks)
    lo = zero if dmax is None else jnp.clip(div(a_lo - dmax, block), 0, num_blocks)
    hi = top if dmin is None else jnp.clip(div(a_hi - dmin, block) + 1, 0, num_blocks)
    hi = jnp.maximum(hi, lo)
    if not full_ok:
        return lo, hi, hi, hi
    if full_bounds is not None:
        dmin, dmax = full_bounds
    flo = lo if dmax is None else -div(dmax - a_hi, block)  # ceil((a_hi - dmax) / block)
    fhi = jnp.int32(num_full) if dmin is None else div(a_lo - dmin + 1, block)
    fhi = jnp.minimum(fhi, num_full)
    flo = jnp.clip(flo, lo, hi)
    fhi = jnp.clip(fhi, flo, hi)
    return lo, flo, fhi, hi


class BlockRanges(NamedTuple):
    """The blocks of the other axis one block of this axis visits, in order: ``[glo, ghi)``
    (blocks holding global tokens below the band; masked; both None when there are no
    global tokens), then the band ``[lo, flo)`` masked, ``[flo, fhi)`` unmasked, ``[fhi,
    hi)`` masked, with ``ghi <= lo <= flo <= fhi <= hi``. With random blocks, the
    candidates ``[rlo, lo)`` and ``[hi, rhi)`` follow, each visited (masked) where
    ``random(j)`` holds; None without. Entries are int32 scalars."""

    glo: Any
    ghi: Any
    lo: Any
    flo: Any
    fhi: Any
    hi: Any
    rlo: Any = None
    rhi: Any = None
    random: Any = None  # block index -> traced bool


# The options of masks.allowed that shape the pattern; the static-options objects of both
# kernels (blockwise_layout.BlockwiseStatic, pallas_kernels.KernelStatic) hold them.
PATTERN_OPTIONS = ("causal", "window", "stride", "global_tokens", "random_blocks")


def pattern_options(st) -> dict:
    """``causal``, ``window``, ``stride``, ``global_tokens``, ``random_blocks`` of a
    static-options object."""
    return {name: getattr(st, name) for name in PATTERN_OPTIONS}


def pattern_ranges(
    a_lo,
    a_hi,
    block: int,
    num_blocks: int,
    *,
    causal: bool,
    window: int | None,
    stride: int | None,
    global_tokens: int,
    num_full: int,
    full_ok: bool = True,
    dual_offset: int | None = None,
    random_blocks=None,
) -> BlockRanges:
    """:class:`BlockRanges` that positions ``a_lo..a_hi`` of this axis visit under the mask
    pattern of :func:`tfmjax.kernels.masks.allowed` (options as there).

    ``dual_offset`` None: this axis holds query positions ``a = p``, the other key slots.
    A static int (the dK/dV orientation): this axis holds keys in query-index units ``a = s -
    dual_offset``, the other query indices ``t`` (so ``p = t + dual_offset``). ``a_lo``,
    ``a_hi`` may be traced; the pattern options are static.

    Window-only masks: the band of :func:`block_range`, exact. A stride: the band is the
    causal range, unmasked only inside the local band (:func:`full_distance_bounds`).
    ``global_tokens = g``: other-axis blocks holding positions ``< g`` (within the causal
    range) are visited too, masked, and a block of this axis holding a position ``< g``
    visits the whole causal range. ``random_blocks``: the rest of the causal range are
    candidates (see :class:`BlockRanges`).
    """
    need = distance_bounds(causal, window, stride)
    full = full_distance_bounds(causal, window, stride)
    causal_only = distance_bounds(causal, None)
    if dual_offset is not None:
        need, full, causal_only = map(_transposed, (need, full, causal_only))
    lo, flo, fhi, hi = block_range(
        a_lo, a_hi, block, num_blocks, *need, num_full=num_full, full_ok=full_ok, full_bounds=full
    )
    if not has_pattern(window, stride) or not (global_tokens or random_blocks):
        return BlockRanges(None, None, lo, flo, fhi, hi)
    clo, _, _, chi = block_range(
        a_lo, a_hi, block, num_blocks, *causal_only, num_full=num_full, full_ok=False
    )
    glo = ghi = None
    if global_tokens:
        global_end = global_tokens - (dual_offset or 0)  # static: positions below are global
        # A block holding global positions visits its whole causal range (the band, and its
        # unmasked part, lie inside that range).
        a_global = jnp.asarray(a_lo, jnp.int32) < global_end
        lo, hi = jnp.where(a_global, clo, lo), jnp.where(a_global, chi, hi)
        # Other-axis blocks holding global positions: [0, ceil(end / block)). Those at or
        # above lo are in the band already (it reaches at least to d = 0, so past every
        # global position when this block holds none); the causal ones below lo are [clo, ghi).
        global_hi = min(max(-(-global_end // block), 0), num_blocks)
        glo, ghi = clo, jnp.minimum(global_hi, lo)
    if random_blocks is None:
        return BlockRanges(glo, ghi, lo, flo, fhi, hi)
    random = _random_candidate(random_blocks, causal, a_lo, a_hi, block, dual_offset)
    return BlockRanges(glo, ghi, lo, flo, fhi, hi, clo if ghi is None else ghi, chi, random)


def _random_candidate(random_blocks, causal: bool, a_lo, a_hi, block: int, dual_offset):
    """``j -> bool``: whether other-axis block ``j`` holds a random pair with positions
    ``a_lo..a_hi`` of this axis (orientation as in :func:`pattern_ranges`)."""
    a_lo, a_hi = jnp.asarray(a_lo, jnp.int32), jnp.asarray(a_hi, jnp.int32)

    def holds_random_pair(j):
        lo = j * block
        if dual_offset is None:  # this axis: queries; the other: key blocks
            p_lo, p_hi, s_lo, s_hi = a_lo, a_hi, lo, lo + block - 1
        else:  # this axis: keys (query-index units); the other: query blocks
            p_lo, p_hi = lo + dual_offset, lo + block - 1 + dual_offset
            s_lo, s_hi = a_lo + dual_offset, a_hi + dual_offset
        return random_blocks_meet(random_blocks, p_lo, p_hi, s_lo, s_hi, causal=causal)

    return holds_random_pair


def block_mask(
    q_pos,
    kv_pos,
    *,
    causal,
    window,
    stride=None,
    global_tokens=0,
    random_blocks=None,
    q_seg=None,
    kv_seg=None,
    kv_len=None,
):
    """:func:`tfmjax.kernels.masks.allowed` for one block, also masking padded keys
    ``kv_pos >= kv_len``."""
    ok = allowed(
        q_pos,
        kv_pos,
        causal=causal,
        window=window,
        stride=stride,
        global_tokens=global_tokens,
        random_blocks=random_blocks,
        q_seg=q_seg,
        kv_seg=kv_seg,
    )
    if kv_len is not None:
        ok = ok & (kv_pos < kv_len)
    return ok


def loop_over_ranges(ranges: BlockRanges, body, carry):
    """``body(j, carry, masked)`` over the blocks of ``ranges`` (see :class:`BlockRanges`):
    the global range and the band's edges masked, the band's middle unmasked, and the random
    candidates that hold a random pair masked (the others are skipped)."""
    masked = functools.partial(body, masked=True)
    if ranges.glo is not None:
        carry = lax.fori_loop(ranges.glo, ranges.ghi, masked, carry)
    carry = lax.fori_loop(ranges.lo, ranges.flo, masked, carry)
    carry = lax.fori_loop(ranges.flo, ranges.fhi, functools.partial(body, masked=False), carry)
    carry = lax.fori_loop(ranges.fhi, ranges.hi, masked, carry)
    if ranges.random is None:
        return carry

    def candidate(j, carry):
        return lax.cond(ranges.random(j), masked, lambda _, c: c, j, carry)

    carry = lax.fori_loop(ranges.rlo, ranges.lo, candidate, carry)
    return lax.fori_loop(ranges.hi, ranges.rhi, candidate, carry)
