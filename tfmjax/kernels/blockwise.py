"""Blockwise attention in pure JAX: online softmax over key blocks (FlashAttention, Dao 2022).

Queries are cut into blocks of ``block_q`` rows and keys into blocks of ``block_k``
columns. For each query block a loop over key blocks keeps the running row maximum
``m``, the running denominator ``l`` and the unnormalised output ``O`` (the online
softmax recurrence), so no ``T x S`` array ever exists. The result is exact.

* **Block skipping.** Causal masks and sliding windows bound the distance
  ``d = p - s`` between a query position ``p`` and a key position ``s``;
  :func:`block_range` turns that into the range of key blocks a query block needs,
  and the sub-range it sees entirely. The inner loop runs only over the needed
  range (its bounds are traced scalars, so a traced ``q_offset`` skips too), and
  only blocks on the edge of the range pay for building and applying a mask.
  :func:`pattern_ranges` adds the sparse patterns of :mod:`tfmjax.kernels.masks`:
  window-only (and plain causal) masks skip exactly as :func:`block_range` says; a
  ``stride`` (Child et al. 2019) reaches keys at any distance, so the needed range is the
  causal one (all blocks up to the diagonal, or all when not causal) and only blocks
  inside the local band are unmasked; ``global_tokens`` (Beltagy et al. 2020) add the key
  blocks holding ``s < g`` as a masked range of their own before the band, and a query
  block holding ``p < g`` visits the whole causal range.
* **Backward.** ``jax.custom_vjp``: the forward saves only ``O`` and the row
  log-sum-exp ``lse = m + log l``; the backward recomputes ``P = exp(S - lse)`` block
  by block (FlashAttention-2), in one pass: outer loop over query blocks carrying
  ``dK, dV`` for the whole key length, inner loop over the needed key blocks
  carrying the block's ``dQ``. Five matmuls per block pair; residuals are O(T).
* **GQA / MQA.** The ``G = N / K`` query heads that share a key/value head form one
  group and share its matmuls (``GTH,SH->GTS``): K and V are never repeated. Groups
  (batch x key/value heads) are processed ``kv_heads_per_step`` at a time, so a score
  block ``[G, bq, bk]`` stays in cache through the passes XLA makes over it.
* **Masks and ALiBi** are built per block by :func:`tfmjax.kernels.masks.allowed`
  and :func:`tfmjax.kernels.masks.alibi_bias` from that block's positions.
* **Ragged lengths.** ``T`` and ``S`` are padded up to the block sizes; padded keys
  are masked, padded queries dropped.

ALiBi slopes, segment ids and ``q_offset`` are treated as constants: they get no
gradient. :func:`block_range` and :func:`block_mask` are shared with the Pallas
kernels in :mod:`tfmjax.kernels.pallas_attention`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from tfmjax.kernels import masks

# Masked scores are set to MASK_VALUE (finite: no inf - inf) and the running row max
# starts at ROW_MAX_INIT, far below any real score but far above MASK_VALUE. Then
# exp(MASK_VALUE - m) == 0 for every row, even one that has seen only masked entries so
# far (its m stays ROW_MAX_INIT), and no second select is needed after the exp; in the
# backward exp(MASK_VALUE - lse) == 0 as well (lse = +inf for rows that see nothing).
MASK_VALUE = -1e30
ROW_MAX_INIT = 0.5 * MASK_VALUE


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Block lengths of the forward and backward passes, and heads per loop step.

    Defaults measured with ``bench/attention.py``-style interleaved runs on a 2-core CPU
    (B=1, N=8, H=64, causal, T=8192): backward 256x512 was the fastest of 128..2048
    (512x1024: 1.5x slower); one key/value head group per step beat 2, 4 and all 8. The
    forward was re-measured at T=1024..8192: 1024x1024 beat 512x512 by 5% at T=1024-2048,
    13% at 4096 and 18-25% at 8192 (2048x2048 and 2048x1024 were no faster). ``None``
    backward sizes reuse the forward's.
    """

    block_q: int = 1024
    block_k: int = 1024
    block_q_bwd: int | None = 256
    block_k_bwd: int | None = 512
    kv_heads_per_step: int = 1

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"BlockSizes.{f.name}={value!r} must be a positive int")

    def backward(self) -> BlockSizes:
        return dataclasses.replace(
            self, block_q=self.block_q_bwd or self.block_q, block_k=self.block_k_bwd or self.block_k
        )


# ----------------------------------------------------------------------------------------
# Block geometry, shared with pallas_attention.py.


def distance_bounds(causal: bool, window: int | None, stride: int | None = None):
    """Bounds ``(dmin, dmax)`` on ``d = p - s`` for a pair the causal rule and the
    window/stride pattern allow (None = unbounded); global tokens aside.

    The same rule as :func:`masks.allowed`: causal is ``s <= p`` (``d >= 0``), a window
    is ``|d| <= window``. A stride allows ``d % stride == 0`` at any distance, so it
    bounds nothing beyond causality.
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
    hi)`` masked, with ``ghi <= lo <= flo <= fhi <= hi``. Entries are int32 scalars."""

    glo: Any
    ghi: Any
    lo: Any
    flo: Any
    fhi: Any
    hi: Any


# The options of masks.allowed that shape the pattern; _Static and KernelStatic hold them.
PATTERN_OPTIONS = ("causal", "window", "stride", "global_tokens")


def pattern_options(st) -> dict:
    """``causal``, ``window``, ``stride``, ``global_tokens`` of a static-options object."""
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
) -> BlockRanges:
    """:class:`BlockRanges` that positions ``a_lo..a_hi`` of this axis visit under the mask
    pattern of :func:`masks.allowed` (options as there).

    ``dual_offset`` None: this axis holds query positions ``a = p``, the other key slots.
    A static int (the dK/dV orientation): this axis holds keys in query-index units ``a = s -
    dual_offset``, the other query indices ``t`` (so ``p = t + dual_offset``). ``a_lo``,
    ``a_hi`` may be traced; the pattern options are static.

    Window-only masks: the band of :func:`block_range`, exact. A stride: the band is the
    causal range, unmasked only inside the local band (:func:`full_distance_bounds`).
    ``global_tokens = g``: other-axis blocks holding positions ``< g`` (within the causal
    range) are visited too, masked, and a block of this axis holding a position ``< g``
    visits the whole causal range.
    """
    need = distance_bounds(causal, window, stride)
    full = full_distance_bounds(causal, window, stride)
    causal_only = distance_bounds(causal, None)
    if dual_offset is not None:
        need, full, causal_only = map(_transposed, (need, full, causal_only))
    lo, flo, fhi, hi = block_range(
        a_lo, a_hi, block, num_blocks, *need, num_full=num_full, full_ok=full_ok, full_bounds=full
    )
    if not global_tokens or not masks.has_pattern(window, stride):
        return BlockRanges(None, None, lo, flo, fhi, hi)
    clo, _, _, chi = block_range(
        a_lo, a_hi, block, num_blocks, *causal_only, num_full=num_full, full_ok=False
    )
    global_end = global_tokens - (dual_offset or 0)  # static: positions below are global
    # A block holding global positions visits its whole causal range (the band, and its
    # unmasked part, lie inside that range).
    a_global = jnp.asarray(a_lo, jnp.int32) < global_end
    lo, hi = jnp.where(a_global, clo, lo), jnp.where(a_global, chi, hi)
    # Other-axis blocks holding global positions: [0, ceil(end / block)). Those at or above
    # lo are in the band already (it reaches at least to d = 0, so past every global
    # position when this block holds none); the causal ones below lo are [clo, ghi).
    global_hi = min(max(-(-global_end // block), 0), num_blocks)
    return BlockRanges(clo, jnp.minimum(global_hi, lo), lo, flo, fhi, hi)


def block_mask(
    q_pos,
    kv_pos,
    *,
    causal,
    window,
    stride=None,
    global_tokens=0,
    q_seg=None,
    kv_seg=None,
    kv_len=None,
):
    """:func:`masks.allowed` for one block, also masking padded keys ``kv_pos >= kv_len``."""
    ok = masks.allowed(
        q_pos,
        kv_pos,
        causal=causal,
        window=window,
        stride=stride,
        global_tokens=global_tokens,
        q_seg=q_seg,
        kv_seg=kv_seg,
    )
    if kv_len is not None:
        ok = ok & (kv_pos < kv_len)
    return ok


def loop_over_ranges(ranges: BlockRanges, body, carry):
    """``body(j, carry, masked)`` over the blocks of ``ranges`` (see :class:`BlockRanges`):
    the global range and the band's edges masked, the band's middle unmasked."""
    masked = functools.partial(body, masked=True)
    if ranges.glo is not None:
        carry = lax.fori_loop(ranges.glo, ranges.ghi, masked, carry)
    carry = lax.fori_loop(ranges.lo, ranges.flo, masked, carry)
    carry = lax.fori_loop(ranges.flo, ranges.fhi, functools.partial(body, masked=False), carry)
    return lax.fori_loop(ranges.fhi, ranges.hi, masked, carry)


# ----------------------------------------------------------------------------------------
# The blockwise computation. The public layouts are regrouped once so that the loops run
# over one (batch, key/value head) group at a time: q [B*K, nq, G, bq, H] and
# k, v [B*K, nk, bk, H]. A group's score block [G, bq, bk] then stays in cache between
# the passes XLA makes over it (max, exp, sum, matmul).


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything static about one call (hashable: the custom_vjp's nondiff argument)."""

    causal: bool
    window: int | None
    scale: float
    q_len: int
    kv_len: int
    blocks: BlockSizes
    stride: int | None = None
    global_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Block sizes and counts of one pass, and the regrouping of the public layouts."""

    bq: int
    bk: int
    nq: int
    nk: int
    K: int
    G: int
    st: _Static

    @classmethod
    def make(cls, st: _Static, bq: int, bk: int, K: int, G: int) -> _Geometry:
        bq, bk = min(bq, st.q_len), min(bk, st.kv_len)
        return cls(bq, bk, -(-st.q_len // bq), -(-st.kv_len // bk), K, G, st)

    def group_q(self, x):
        """``[B,T,N,...]`` -> ``[B*K, nq, G, bq, ...]`` (rows: ``...`` is ``H`` or empty)."""
        B, T, tail = x.shape[0], x.shape[1], x.shape[3:]
        x = jnp.pad(x, ((0, 0), (0, self.nq * self.bq - T)) + ((0, 0),) * (x.ndim - 2))
        x = x.reshape(B, self.nq, self.bq, self.K, self.G, *tail)
        x = jnp.moveaxis(x, (3, 1, 4, 2), (1, 2, 3, 4))
        return x.reshape(B * self.K, self.nq, self.G, self.bq, *tail)

    def ungroup_q(self, x):
        """Inverse of :meth:`group_q`."""
        tail = x.shape[4:]
        B = x.shape[0] // self.K
        x = x.reshape(B, self.K, self.nq, self.G, self.bq, *tail)
        x = jnp.moveaxis(x, (1, 2, 3, 4), (3, 1, 4, 2))
        return x.reshape(B, self.nq * self.bq, self.K * self.G, *tail)[:, : self.st.q_len]

    def group_kv(self, x):
        """``[B,S,K,H]`` -> ``[B*K, nk, bk, H]``."""
        B, S, K, H = x.shape
        x = jnp.pad(x, ((0, 0), (0, self.nk * self.bk - S), (0, 0), (0, 0)))
        x = x.reshape(B, self.nk, self.bk, K, H).transpose(0, 3, 1, 2, 4)
        return x.reshape(B * K, self.nk, self.bk, H)

    def ungroup_kv(self, x):
        B = x.shape[0] // self.K
        x = x.reshape(B, self.K, self.nk * self.bk, x.shape[-1]).transpose(0, 2, 1, 3)
        return x[:, : self.st.kv_len]

    def group_seg(self, seg, block, n):
        """``[B,L]`` segment ids -> ``[B*K, n, block]``, padded with 0 (= padding)."""
        if seg is None:
            return None
        seg = jnp.pad(seg, ((0, 0), (0, n * block - seg.shape[1])))
        return jnp.repeat(seg.reshape(seg.shape[0], n, block), self.K, axis=0)

    def group_slopes(self, slopes, B):
        """``[N]`` -> ``[B*K, G]``."""
        if slopes is None:
            return None
        return jnp.tile(slopes.astype(jnp.float32).reshape(1, self.K, self.G), (B, 1, 1)).reshape(
            B * self.K, self.G
        )


class _Scores:
    """Scores of one (query block i, key block j) pair of one group: ``[G, bq, bk]`` f32."""

    def __init__(
        self,
        geo: _Geometry,
        offset,
        q_seg,
        kv_seg,
        slopes,
        prescaled: bool,
        k_transposed: bool = False,
    ):
        self.geo, self.offset, self.slopes, self.prescaled = geo, offset, slopes, prescaled
        self.qk_spec = "GTH,HS->GTS" if k_transposed else "GTH,SH->GTS"
        self.q_seg, self.kv_seg = q_seg, kv_seg  # [nq, bq], [nk, bk] or None

    def ranges(self, i) -> BlockRanges:
        """The key blocks query block ``i`` visits."""
        geo = self.geo
        p_lo = self.offset + i * geo.bq
        return pattern_ranges(
            p_lo,
            p_lo + geo.bq - 1,
            geo.bk,
            geo.nk,
            **pattern_options(geo.st),
            num_full=geo.st.kv_len // geo.bk,
            full_ok=self.q_seg is None,
        )

    def __call__(self, qb, kb, i, j, masked):
        """Scaled scores plus ALiBi, masked entries (if ``masked``) at MASK_VALUE."""
        geo, st = self.geo, self.geo.st
        s = jnp.einsum(self.qk_spec, qb, kb, preferred_element_type=jnp.float32)
        if not self.prescaled:
            s = s * st.scale
        q_pos = self.offset + i * geo.bq + jnp.arange(geo.bq, dtype=jnp.int32)
        kv_pos = j * geo.bk + jnp.arange(geo.bk, dtype=jnp.int32)
        if self.slopes is not None:
            s = s + masks.alibi_bias(self.slopes, q_pos, kv_pos)  # [G, bq, bk]
        if not masked:
            return s
        q_seg = None if self.q_seg is None else self.q_seg[i][None, :, None]
        kv_seg = None if self.kv_seg is None else self.kv_seg[j][None, None, :]
        mask = block_mask(
            q_pos[None, :, None],
            kv_pos[None, None, :],
            **pattern_options(st),
            q_seg=q_seg,
            kv_seg=kv_seg,
            kv_len=st.kv_len if geo.nk * geo.bk != st.kv_len else None,
        )
        return jnp.where(mask, s, MASK_VALUE)


def _forward_group(geo: _Geometry, prescaled: bool, offset, q_b, k_b, v_b, q_seg, kv_seg, slopes):
    """One group: ``q_b [nq,G,bq,H]``, ``k_b [nk,H,bk]``, ``v_b [nk,bk,H]`` -> out, lse
    ``[nq,G,bq(,H)]``. (K is stored transposed: the QK^T matmul's natural layout.)"""
    scores = _Scores(geo, offset, q_seg, kv_seg, slopes, prescaled, k_transposed=True)

    def q_block(_, xs):
        qb, i = xs

        def body(j, carry, masked):
            m, l, acc = carry
            s = scores(qb, k_b[j], i, j, masked)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            alpha = jnp.exp(m - m_new)
            pv = jnp.einsum(
                "GTS,SH->GTH", p.astype(v_b.dtype), v_b[j], preferred_element_type=jnp.float32
            )
            return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

        rows = qb.shape[:-1]
        init = (
            jnp.full(rows, ROW_MAX_INIT, jnp.float32),
            jnp.zeros(rows, jnp.float32),
            jnp.zeros(qb.shape, jnp.float32),
        )
        m, l, acc = loop_over_ranges(scores.ranges(i), body, init)
        seen = l > 0
        l_safe = jnp.where(seen, l, 1.0)
        lse = jnp.where(seen, m + jnp.log(l_safe), jnp.inf)
        return None, ((acc / l_safe[..., None]).astype(q_b.dtype), lse)

    return lax.scan(q_block, None, (q_b, jnp.arange(geo.nq)))[1]


def _backward_group(
    geo: _Geometry,
    prescaled: bool,
    offset,
    q_b,
    k_b,
    v_b,
    q_seg,
    kv_seg,
    slopes,
    do_b,
    lse_b,
    delta_b,
):
    """One group: returns ``dq [nq,G,bq,H]`` (unscaled), ``dk, dv [nk,bk,H]`` (float32).

    Outer loop over query blocks carrying dK, dV of the whole key length; inner loop over
    the key blocks the query block sees, carrying its dQ.
    """
    scores = _Scores(geo, offset, q_seg, kv_seg, slopes, prescaled)
    dt = q_b.dtype

    def q_block(dkv, xs):
        qb, dob, lseb, deltab, i = xs

        def body(j, carry, masked):
            dq, dk, dv = carry
            kb, vb = k_b[j], v_b[j]
            p = jnp.exp(scores(qb, kb, i, j, masked) - lseb[..., None])
            dp = jnp.einsum("GTH,SH->GTS", dob, vb, preferred_element_type=jnp.float32)
            ds = (p * (dp - deltab[..., None])).astype(dt)
            f32 = dict(preferred_element_type=jnp.float32)
            dv = dv.at[j].add(jnp.einsum("GTS,GTH->SH", p.astype(dt), dob, **f32))
            dk = dk.at[j].add(jnp.einsum("GTS,GTH->SH", ds, qb, **f32))
            return dq + jnp.einsum("GTS,SH->GTH", ds, kb, **f32), dk, dv

        dq, dk, dv = loop_over_ranges(
            scores.ranges(i), body, (jnp.zeros(qb.shape, jnp.float32), *dkv)
        )
        return (dk, dv), dq

    zeros = jnp.zeros(k_b.shape, jnp.float32)
    xs = (q_b, do_b, lse_b, delta_b, jnp.arange(geo.nq))
    (dk, dv), dq = lax.scan(q_block, (zeros, zeros), xs)
    return dq, dk, dv


def _setup(st: _Static, bq: int, bk: int, q, k, v, q_seg, kv_seg, slopes):
    """Geometry, and the per-group arguments (q scaled when float32)."""
    B, N, K = q.shape[0], q.shape[2], k.shape[2]
    geo = _Geometry.make(st, bq, bk, K, N // K)
    # float32 queries are pre-scaled (saves a pass over every score block); for lower
    # precisions the scale is applied to the float32 scores instead.
    prescaled = q.dtype == jnp.float32
    qs = q * jnp.asarray(st.scale, q.dtype) if prescaled else q
    groups = (
        geo.group_q(qs),
        geo.group_kv(k),
        geo.group_kv(v),
        geo.group_seg(q_seg, geo.bq, geo.nq),
        geo.group_seg(kv_seg, geo.bk, geo.nk),
        geo.group_slopes(slopes, B),
    )
    return geo, prescaled, groups


def _forward(st: _Static, q, k, v, q_seg, kv_seg, slopes, offset):
    """``out [B,T,N,H]`` (q's dtype) and ``lse [B,T,N]`` (float32, +inf for empty rows)."""
    geo, prescaled, groups = _setup(
        st, st.blocks.block_q, st.blocks.block_k, q, k, v, q_seg, kv_seg, slopes
    )
    groups = (groups[0], jnp.swapaxes(groups[1], -1, -2)) + groups[2:]  # K as [H, bk]
    fn = functools.partial(_forward_group, geo, prescaled, offset)
    out, lse = lax.map(lambda xs: fn(*xs), groups, batch_size=st.blocks.kv_heads_per_step)
    return geo.ungroup_q(out), geo.ungroup_q(lse)


def _backward(st: _Static, res, d_out):
    q, k, v, q_seg, kv_seg, slopes, offset, out, lse = res
    bwd = st.blocks.backward()
    geo, prescaled, groups = _setup(st, bwd.block_q, bwd.block_k, q, k, v, q_seg, kv_seg, slopes)
    delta = jnp.einsum("BTNH,BTNH->BTN", d_out.astype(jnp.float32), out.astype(jnp.float32))
    extra = (geo.group_q(d_out.astype(q.dtype)), geo.group_q(lse), geo.group_q(delta))
    fn = functools.partial(_backward_group, geo, prescaled, offset)
    dq, dk, dv = lax.map(lambda xs: fn(*xs), groups + extra, batch_size=st.blocks.kv_heads_per_step)
    dq = (geo.ungroup_q(dq) * st.scale).astype(q.dtype)
    dk = geo.ungroup_kv(dk)  # = dS^T (scale * q) when q was pre-scaled
    dk = (dk if prescaled else dk * st.scale).astype(k.dtype)
    return dq, dk, geo.ungroup_kv(dv).astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, q_seg, kv_seg, slopes, offset):
    return _forward(st, q, k, v, q_seg, kv_seg, slopes, offset)[0]


def _attention_fwd(st, q, k, v, q_seg, kv_seg, slopes, offset):
    out, lse = _forward(st, q, k, v, q_seg, kv_seg, slopes, offset)
    return out, (q, k, v, q_seg, kv_seg, slopes, offset, out, lse)


def _attention_bwd(st, res, d_out):
    slopes = res[5]  # slopes, segment ids and offset are constants: no gradient
    return (
        *_backward(st, res, d_out),
        None,
        None,
        None if slopes is None else jnp.zeros_like(slopes),
        None,
    )


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(
    q,
    k,
    v,
    *,
    causal,
    q_segment_ids,
    kv_segment_ids,
    window,
    alibi_slopes,
    bias,
    q_offset,
    scale,
    stride: int | None = None,
    global_tokens: int = 0,
    block_sizes: BlockSizes | None = None,
):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]``; see the module docstring (mask
    options as in :mod:`tfmjax.kernels.masks`).

    ``q_offset`` may be a traced int32 scalar (decoding); block skipping still applies.
    """
    if bias is not None:
        raise ValueError(
            "impl='blockwise' takes structured masks only; a dense bias needs "
            "impl='xla' or 'reference'"
        )
    st = _Static(
        causal=bool(causal),
        window=None if window is None else int(window),
        scale=float(scale),
        q_len=q.shape[1],
        kv_len=k.shape[1],
        blocks=block_sizes or BlockSizes(),
        stride=None if stride is None else int(stride),
        global_tokens=int(global_tokens),
    )
    if q_segment_ids is not None:
        q_segment_ids = q_segment_ids.astype(jnp.int32)
        kv_segment_ids = kv_segment_ids.astype(jnp.int32)
    offset = jnp.asarray(q_offset, jnp.int32)
    return _attention(st, q, k, v, q_segment_ids, kv_segment_ids, alibi_slopes, offset)
