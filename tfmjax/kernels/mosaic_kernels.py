"""The three Mosaic GPU (Hopper, sm_90) kernel bodies of :mod:`tfmjax.kernels.mosaic_attention`.

Every kernel is warp specialised: a CTA holds ``WGS = 2`` compute warpgroups of 64 rows each
and one memory warpgroup that streams tiles from global into shared memory with bulk (TMA)
copies, through a ring of ``stages`` slots (:mod:`tfmjax.kernels.mosaic_pipeline`). The compute
warpgroups multiply with ``wgmma`` from shared memory (or registers, for ``P`` and ``dS``)
into float32 accumulators.

* ``fwd_kernel``: a CTA per (batch ``b``, query head ``n``, 128 query rows); streams K, V
  (and key segment ids) of head ``n // G``; online softmax in base 2 (scores times
  ``scale * log2 e``); writes ``O`` and ``lse2 = m + log2 l`` (base 2).
* ``dq_kernel``: the same grid and stream; ``dQ = scale * sum_j dS_j K_j``.
* ``dkv_kernel``: a CTA per (batch, key/value head ``h``, 128 keys); streams Q, dO, lse2,
  delta (and query segment ids) of the ``G`` query heads of the group and the query
  blocks that see those keys, in the transposed orientation ``S^T = K Q^T``; sums the
  group's dK/dV in registers.

Both compute warpgroups of a CTA walk the same block range (the union of their rows'); a
block that is past one warpgroup's diagonal is masked for it. Block ranges: causal rows see
key blocks ``[0, hi)``; blocks wholly below the CTA's diagonal (and holding no padded key)
skip the mask. Masks are :func:`tfmjax.kernels.masks.allowed`, masked scores
``MASK_VALUE`` and the running max starts at ``ROW_MAX_INIT``
(:mod:`tfmjax.kernels.block_geometry`), so a row that sees nothing gives ``O = 0`` and
``lse2 = +inf``.

``interpret``: the kernels also run in Pallas's GPU interpreter on a CPU
(``plgpu.force_gpu_interpret_mode``), which simulates shared memory, the warpgroups and the
barriers; it cannot run ``pl.run_state`` over an accumulator nor a ``wgmma`` whose left
operand is in registers, so there (:func:`mma`) an accumulating ``wgmma`` is a fresh one
plus an add, and ``P V``, ``dS K`` and their kin a ``dot`` of the loaded tile: the same sums.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from tfmjax.kernels.block_geometry import MASK_VALUE, ROW_MAX_INIT
from tfmjax.kernels.masks import allowed
from tfmjax.kernels.mosaic_pipeline import (
    Stream,
    produce,
    release,
    slot_of,
    take_turns,
    wait_full,
)

WGS = 2  # compute warpgroups per CTA
ROWS = 64  # rows of one compute warpgroup (a wgmma's M)
LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class MosaicStatic:
    """Everything static about a call. ``kv_len``: the real key length ``S``;
    ``offset``: the static position of query 0; ``block_k`` (fwd, dQ: keys per streamed
    step) and ``block_q`` (dK/dV: query rows per step); ``stages``: ring slots."""

    causal: bool
    scale: float
    kv_len: int
    offset: int
    has_seg: bool
    groups: int
    block_k: int = 128
    block_k_dq: int = 64
    block_q_dkv: int = 64
    stages: int = 2
    pingpong: bool = False
    interpret: bool = False

    @property
    def score_scale(self) -> float:
        return self.scale * LOG2E


def tile_transforms():
    """Shared-memory layout of bf16/fp16 tiles whose width is a multiple of 64: 8x64 tiles,
    128-byte swizzle (what ``wgmma`` reads without bank conflicts)."""
    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


# ----------------------------------------------------------------------------------------
# Pieces shared by the three kernels.


def mma(st: MosaicStatic, a, b, shape=None, acc=None, issued=None):
    """``a @ b`` (plus ``acc``) in float32 with one ``wgmma``; ``a`` a shared-memory ref or
    registers, ``b`` a shared-memory ref (``.transpose((1, 0))`` for ``B^T``). ``issued``:
    called once a fresh product's ``wgmma`` is issued, before its result is awaited."""

    if st.interpret and isinstance(a, jax.Array):  # the interpreter's wgmma reads refs only
        product = lax.dot(a, b[...], preferred_element_type=jnp.float32)
        if acc is None and issued is not None:
            issued()
        return product if acc is None else acc + product
    if acc is None:

        def fresh(acc_ref):
            plgpu.wgmma(acc_ref, a, b)
            if issued is not None:
                issued()
            return acc_ref[...]

        return pl.run_scoped(fresh, plgpu.ACC(shape, jnp.float32))
    if st.interpret:  # the interpreter has no run_state over accumulators
        return acc + mma(st, a, b, acc.shape)

    def accumulate(acc_ref):
        plgpu.wgmma(acc_ref, a, b)

    return pl.run_state(accumulate)(plgpu.ACC.init(acc))


def mma_pair(st: MosaicStatic, first, second):
    """Two accumulating products ``acc + a @ b``, each ``(a, b, acc)`` as in :func:`mma`,
    issued together and awaited once (one ``wgmma`` wait instead of two, as jax's
    ``attention_mgpu.py`` does for dV and dP^T); in the interpreter, one after the other."""
    if st.interpret:
        return tuple(mma(st, a, b, acc=acc) for a, b, acc in (first, second))

    def both(refs):
        for acc_ref, (a, b, _) in zip(refs, (first, second), strict=True):
            plgpu.wgmma(acc_ref, a, b)

    return pl.run_state(both)((plgpu.ACC.init(first[2]), plgpu.ACC.init(second[2])))


def zeros(shape):
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)


def row_vector(x, shape):
    """A per-row vector ``[M]`` broadcast to ``[M, N]``."""
    return lax.broadcast_in_dim(x, shape, [0])


def col_vector(x, shape):
    """A per-column vector ``[N]`` broadcast to ``[M, N]``."""
    return lax.broadcast_in_dim(x, shape, [1])


def positions(shape, row_start, col_start):
    """Row and column indices of a ``[M, N]`` tile, offset by the given starts."""
    rows = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA)
    cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA)
    return rows + row_start, cols + col_start


def _broadcast_segments(q_seg, kv_seg, shape):
    if q_seg is None:
        return None, None
    return row_vector(q_seg, shape), col_vector(kv_seg, shape)


def _mask(st: MosaicStatic, s, q_pos, kv_pos, q_seg, kv_seg):
    ok = allowed(q_pos, kv_pos, causal=st.causal, window=None, q_seg=q_seg, kv_seg=kv_seg)
    ok = ok & (kv_pos < st.kv_len)
    return jnp.where(ok, s, MASK_VALUE)


def query_block_range(st: MosaicStatic, row0, block_k: int, num_k: int):
    """Key blocks ``[0, hi)`` that the CTA's rows ``row0 .. row0 + 127`` see, and the first
    ``full`` of them that need no mask (``full <= hi``)."""
    if st.causal:
        last_pos = st.offset + row0 + WGS * ROWS - 1
        hi = jnp.minimum(lax.div(last_pos, block_k) + 1, num_k)
        full = jnp.minimum(lax.div(st.offset + row0 + 1, block_k), st.kv_len // block_k)
    else:
        hi = jnp.asarray(num_k, jnp.int32)
        full = jnp.asarray(st.kv_len // block_k, jnp.int32)
    if st.has_seg:  # every step masked: the key segments' stream is consumed only there
        full = jnp.zeros_like(full)  # (an unconsumed slot would stall the memory warpgroup)
    return hi, jnp.minimum(full, hi)


def key_block_range(st: MosaicStatic, key0, block_q: int, num_q: int):
    """Query blocks ``[lo, num_q)`` that see the CTA's keys ``key0 .. key0 + 127``, and the
    first of them, ``full``, from which on no mask is needed."""
    if st.causal:
        lo = jnp.maximum(lax.div(jnp.maximum(key0 - st.offset, 0), block_q), 0)
        # min query position of block i >= last key of the CTA
        first_full = lax.div(key0 + WGS * ROWS - 1 - st.offset + block_q - 1, block_q)
        full = jnp.clip(first_full, lo, num_q)
    else:
        lo = jnp.asarray(0, jnp.int32)
        full = lo
    if st.has_seg:  # every step masked: the query segments' stream is consumed only there
        full = jnp.asarray(num_q, jnp.int32)
    return lo, full


# ----------------------------------------------------------------------------------------
# Kernels. Global layouts: q, o, dO [B,Tp,N,Hp]; k, v [B,Sp,K,Hp]; dk, dv [B,Sp,K,Hp];
# lse2, delta [B,N,Tp] float32; q_seg [B,Tp], kv_seg [B,Sp] int32. Each kernel takes its
# refs, then ``scratch``: (per-warpgroup buffers, rings, full barriers, consumed barriers).

_ROW = "row"
_COL = "col"


def _vector_layout(kind):
    """Layout of a per-row (``[M]`` of an ``[M, N]`` tile) or per-column vector."""
    return plgpu.Layout.WGMMA.reduce(1 if kind == _ROW else 0)


def _load_vector(ref, kind):
    return plgpu.load(ref, layout=_vector_layout(kind))


def _streams(sources, scratch):
    _, rings, full, consumed = scratch
    return [Stream(*parts) for parts in zip(sources, rings, full, consumed, strict=True)]


def _load_tiles(loads, bars, wg):
    """Copy each ``(source, shared-memory destination)`` of warpgroup ``wg`` with its own
    barrier ``bars[i * WGS + wg]`` and wait for all of them."""
    for i, (src, dst) in enumerate(loads):
        plgpu.copy_gmem_to_smem(src, dst, bars.at[i * WGS + wg])
    for i in range(len(loads)):
        plgpu.barrier_wait(bars.at[i * WGS + wg])


def _query_side(st: MosaicStatic, k_ref, v_ref, kv_seg_ref, bk: int, scratch):
    """What the forward and dQ kernels share: the CTA's ``(b, n, wg, row0)``, its key block
    range ``hi, full`` and the K, V (and key segment id) streams of head ``n // G``."""
    b, n, wg = lax.axis_index("b"), lax.axis_index("n"), lax.axis_index("wg")
    h = lax.div(n, jnp.asarray(st.groups, jnp.int32))
    row0 = lax.axis_index("rows") * (WGS * ROWS)
    hi, full = query_block_range(st, row0, bk, k_ref.shape[1] // bk)
    keys = lambda j: pl.ds(j * bk, bk)  # noqa: E731
    sources = [lambda j: k_ref.at[b, keys(j), h], lambda j: v_ref.at[b, keys(j), h]]
    if st.has_seg:
        sources.append(lambda j: kv_seg_ref.at[b, keys(j)])
    return (b, n, wg, row0), (hi, full), _streams(sources, scratch)


def _mask_query_block(st: MosaicStatic, s, streams, slot, rows, j, bk: int, q_seg):
    """Scores ``s [64, bk]`` of rows ``rows ..`` against key block ``j``, masked (the forward
    and dQ kernels); reads and releases the key segment ids' slot."""
    kv_seg = None
    if st.has_seg:
        kv_seg = _load_vector(wait_full(streams[2], slot), _COL)
        release(streams[2], slot)
    q_pos, kv_pos = positions(s.shape, st.offset + rows, j * bk)
    return _mask(st, s, q_pos, kv_pos, *_broadcast_segments(q_seg, kv_seg, s.shape))


def _split_refs(refs, st: MosaicStatic, n_in: int):
    """``(inputs, (q_seg, kv_seg), outputs, scratch)`` of a kernel's refs."""
    refs = list(refs)
    inputs, refs = refs[:n_in], refs[n_in:]
    segs = (refs.pop(0), refs.pop(0)) if st.has_seg else (None, None)
    return inputs, segs, refs[:-1], refs[-1]


def fwd_kernel(*refs, st: MosaicStatic):
    """A CTA of 128 query rows (64 per compute warpgroup ``w``) of query head ``n``."""
    (q_ref, k_ref, v_ref), (q_seg_ref, kv_seg_ref), (o_ref, lse_ref), scratch = _split_refs(
        refs, st, 3
    )
    bk, Hp, dtype = st.block_k, q_ref.shape[-1], q_ref.dtype
    (b, n, wg, row0), (hi, full), streams = _query_side(st, k_ref, v_ref, kv_seg_ref, bk, scratch)
    qo_smem, lse_smem, qseg_smem, q_bar, schedule = scratch[0]
    turn = functools.partial(take_turns, schedule) if st.pingpong else None

    @pl.when(wg < WGS)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        rows = row0 + wg * ROWS
        q_smem = qo_smem.at[wg]
        loads = [(q_ref.at[b, pl.ds(rows, ROWS), n], q_smem)]
        if st.has_seg:
            loads.append((q_seg_ref.at[b, pl.ds(rows, ROWS)], qseg_smem.at[wg]))
        _load_tiles(loads, q_bar, wg)
        q_seg = _load_vector(qseg_smem.at[wg], _ROW) if st.has_seg else None
        if turn:
            pl.when(wg == 1)(turn)

        def step(j, carry, masked):
            m, l, acc = carry
            slot = slot_of(j, st.stages)
            k_t = wait_full(streams[0], slot).transpose((1, 0))
            s = mma(st, q_smem, k_t, (ROWS, bk), issued=turn) * st.score_scale
            release(streams[0], slot)
            if masked:
                s = _mask_query_block(st, s, streams, slot, rows, j, bk, q_seg)
            m_new = jnp.maximum(m, s.max(axis=1))
            alpha = jnp.exp2(m - m_new)
            p = jnp.exp2(s - row_vector(m_new, s.shape))
            l = l * alpha + p.sum(axis=1)
            acc = acc * row_vector(alpha, acc.shape)
            p16 = p.astype(dtype)
            if turn:  # done with the softmax (kept before the turn): wait for V, tensor cores
                m_new, l, acc, p16 = lax.optimization_barrier((m_new, l, acc, p16))
                plgpu.barrier_arrive(schedule)
            v_smem = wait_full(streams[1], slot)
            if turn:
                plgpu.barrier_wait(schedule)
            acc = mma(st, p16, v_smem, acc=acc)
            release(streams[1], slot)
            return m_new, l, acc

        m = plgpu.layout_cast(jnp.full((ROWS,), ROW_MAX_INIT, jnp.float32), _vector_layout(_ROW))
        l = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), _vector_layout(_ROW))
        carry = (m, l, zeros((ROWS, Hp)))
        carry = lax.fori_loop(0, full, lambda j, c: step(j, c, masked=False), carry)
        m, l, acc = lax.fori_loop(full, hi, lambda j, c: step(j, c, masked=True), carry)
        if turn:
            pl.when(wg == 0)(turn)
        seen = l > 0
        l_safe = jnp.where(seen, l, 1.0)
        q_smem[...] = (acc / row_vector(l_safe, acc.shape)).astype(dtype)
        lse_smem.at[wg][...] = jnp.where(seen, m + jnp.log2(l_safe), jnp.inf)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, o_ref.at[b, pl.ds(rows, ROWS), n])
        plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[b, n, pl.ds(rows, ROWS)])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == WGS)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        produce(streams, hi, st.stages, k_ref.shape[1] // bk)


def dq_kernel(*refs, st: MosaicStatic):
    """``dQ`` of a CTA of 128 query rows of query head ``n`` (the forward's grid)."""
    inputs, (q_seg_ref, kv_seg_ref), (dq_ref,), scratch = _split_refs(refs, st, 6)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = inputs
    bk, Hp, dtype = st.block_k_dq, q_ref.shape[-1], q_ref.dtype
    (b, n, wg, row0), (hi, full), streams = _query_side(st, k_ref, v_ref, kv_seg_ref, bk, scratch)
    q_smem2, do_smem2, lse_smem2, delta_smem2, qseg_smem2, bars = scratch[0]

    @pl.when(wg < WGS)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        rows = row0 + wg * ROWS
        row_slice = pl.ds(rows, ROWS)
        loads = [
            (q_ref.at[b, row_slice, n], q_smem2.at[wg]),
            (do_ref.at[b, row_slice, n], do_smem2.at[wg]),
            (lse_ref.at[b, n, row_slice], lse_smem2.at[wg]),
            (delta_ref.at[b, n, row_slice], delta_smem2.at[wg]),
        ]
        if st.has_seg:
            loads.append((q_seg_ref.at[b, row_slice], qseg_smem2.at[wg]))
        _load_tiles(loads, bars, wg)
        q_smem, do_smem = q_smem2.at[wg], do_smem2.at[wg]
        lse = _load_vector(lse_smem2.at[wg], _ROW)
        delta = _load_vector(delta_smem2.at[wg], _ROW)
        q_seg = _load_vector(qseg_smem2.at[wg], _ROW) if st.has_seg else None

        def step(j, dq, masked):
            slot = slot_of(j, st.stages)
            k_smem = wait_full(streams[0], slot)
            s = mma(st, q_smem, k_smem.transpose((1, 0)), (ROWS, bk)) * st.score_scale
            if masked:
                s = _mask_query_block(st, s, streams, slot, rows, j, bk, q_seg)
            p = jnp.exp2(s - row_vector(lse, s.shape))
            dp = mma(st, do_smem, wait_full(streams[1], slot).transpose((1, 0)), (ROWS, bk))
            release(streams[1], slot)
            ds = p * (dp - row_vector(delta, dp.shape))
            dq = mma(st, ds.astype(dtype), k_smem, acc=dq)
            release(streams[0], slot)
            return dq

        dq = lax.fori_loop(0, full, lambda j, c: step(j, c, masked=False), zeros((ROWS, Hp)))
        dq = lax.fori_loop(full, hi, lambda j, c: step(j, c, masked=True), dq)
        q_smem[...] = (dq * st.scale).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[b, row_slice, n])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == WGS)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        produce(streams, hi, st.stages, k_ref.shape[1] // bk)


def dkv_kernel(*refs, st: MosaicStatic):
    """``dK, dV`` of a CTA of 128 keys (64 per compute warpgroup) of key/value head ``h``,
    summed over the group's query heads ``h G .. h G + G - 1``; works on ``S^T = K Q^T``."""
    inputs, (q_seg_ref, kv_seg_ref), (dk_ref, dv_ref), scratch = _split_refs(refs, st, 6)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = inputs
    b, h, wg = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("wg")
    key0 = lax.axis_index("keys") * (WGS * ROWS)
    bq, Hp, dtype, G = st.block_q_dkv, q_ref.shape[-1], q_ref.dtype, st.groups
    num_q = q_ref.shape[1] // bq
    lo, full = key_block_range(st, key0, bq, num_q)
    visible = num_q - lo  # query blocks per head of the group

    def block(step):  # (query head, query rows) of a flat step over (g, i)
        g = lax.div(step, visible)
        return h * G + g, pl.ds((lo + lax.rem(step, visible)) * bq, bq)

    sources = [
        lambda t: q_ref.at[b, block(t)[1], block(t)[0]],
        lambda t: do_ref.at[b, block(t)[1], block(t)[0]],
        lambda t: lse_ref.at[b, block(t)[0], block(t)[1]],
        lambda t: delta_ref.at[b, block(t)[0], block(t)[1]],
    ]
    if st.has_seg:
        sources.append(lambda t: q_seg_ref.at[b, block(t)[1]])
    streams = _streams(sources, scratch)
    k_smem2, v_smem2, kvseg_smem2, bars = scratch[0]

    @pl.when(wg < WGS)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        keys = key0 + wg * ROWS
        key_slice = pl.ds(keys, ROWS)
        loads = [
            (k_ref.at[b, key_slice, h], k_smem2.at[wg]),
            (v_ref.at[b, key_slice, h], v_smem2.at[wg]),
        ]
        if st.has_seg:
            loads.append((kv_seg_ref.at[b, key_slice], kvseg_smem2.at[wg]))
        _load_tiles(loads, bars, wg)
        k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
        kv_seg = _load_vector(kvseg_smem2.at[wg], _ROW) if st.has_seg else None

        def step(g, i, carry, masked):
            dk, dv = carry
            slot = slot_of(g * visible + (i - lo), st.stages)
            q_smem = wait_full(streams[0], slot)
            s_t = mma(st, k_smem, q_smem.transpose((1, 0)), (ROWS, bq)) * st.score_scale
            if masked:
                q_seg = None
                if st.has_seg:
                    q_seg = _load_vector(wait_full(streams[4], slot), _COL)
                    release(streams[4], slot)
                kv_pos, q_pos = positions(s_t.shape, keys, st.offset + i * bq)
                segs = (None, None)
                if st.has_seg:
                    segs = (col_vector(q_seg, s_t.shape), row_vector(kv_seg, s_t.shape))
                s_t = _mask(st, s_t, q_pos, kv_pos, *segs)
            lse = _load_vector(wait_full(streams[2], slot), _COL)
            release(streams[2], slot)
            p_t = jnp.exp2(s_t - col_vector(lse, s_t.shape))
            do_smem = wait_full(streams[1], slot)
            dv, dp_t = mma_pair(
                st,
                (p_t.astype(dtype), do_smem, dv),  # dV += P^T dO
                (v_smem, do_smem.transpose((1, 0)), zeros((ROWS, bq))),  # dP^T = V dO^T
            )
            release(streams[1], slot)
            delta = _load_vector(wait_full(streams[3], slot), _COL)
            release(streams[3], slot)
            ds_t = p_t * (dp_t - col_vector(delta, dp_t.shape))
            dk = mma(st, ds_t.astype(dtype), q_smem, acc=dk)
            release(streams[0], slot)
            return dk, dv

        def head(g, carry):
            carry = lax.fori_loop(lo, full, lambda i, c: step(g, i, c, masked=True), carry)
            return lax.fori_loop(full, num_q, lambda i, c: step(g, i, c, masked=False), carry)

        dk, dv = lax.fori_loop(0, G, head, (zeros((ROWS, Hp)), zeros((ROWS, Hp))))
        k_smem[...] = (dk * st.scale).astype(dtype)
        v_smem[...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[b, key_slice, h])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[b, key_slice, h])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == WGS)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")
        produce(streams, G * visible, st.stages, G * num_q)
