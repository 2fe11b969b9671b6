"""The three Pallas kernel bodies of :mod:`tfmjax.kernels.pallas_attention` and their helpers.

``fwd_kernel`` (one program per batch, query head, query block: online softmax over the key
blocks it can see), ``dkv_kernel`` (per batch, key/value head, key block: loops over the
group's query heads and their query blocks, on ``S^T``) and ``dq_kernel`` (per batch, query
head, query block). :class:`KernelStatic` holds everything static about a call; the block
ranges and masks come from :mod:`tfmjax.kernels.block_geometry`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tfmjax.kernels.block_geometry import (
    MASK_VALUE,
    ROW_MAX_INIT,
    BlockRanges,
    block_mask,
    loop_over_ranges,
    pattern_options,
    pattern_ranges,
)
from tfmjax.kernels.masks import alibi_bias
from tfmjax.kernels.pallas_tuning import DEFAULT_LAUNCH, GPU_PLATFORMS


def pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True)
class KernelStatic:
    """Everything static about a call (the custom_vjp's nondiff argument)."""

    causal: bool
    window: int | None
    scale: float
    q_len: int
    kv_len: int
    static_offset: int | None  # None: q_offset is traced, no block skipping
    has_seg: bool
    has_alibi: bool
    groups: int  # G = N / K
    blocks: object  # pallas_attention.BlockSizes
    platform: str  # "cpu" (interpret), "cuda", "tpu"
    stride: int | None = None  # the sparse patterns of tfmjax.kernels.masks
    global_tokens: int = 0
    random_blocks: object = None  # masks.RandomBlocks
    launch: object = DEFAULT_LAUNCH  # pallas_tuning.Launch: Triton warps and stages

    def geometry(self, block_q: int, block_k: int):
        """``bq, bk`` clipped to the lengths; ``nq, nk``: blocks holding real rows."""
        bq = min(block_q, max(pow2(self.q_len), 8))
        bk = min(block_k, max(pow2(self.kv_len), 8))
        return bq, bk, -(-self.q_len // bq), -(-self.kv_len // bk)

    @property
    def padded_lens(self):
        """Padded ``T``, ``S``: multiples of every block size used by the three kernels."""
        b = self.blocks
        bq = max(self.geometry(x, 8)[0] for x in (b.block_q, b.block_q_dkv, b.block_q_dq))
        bk = max(self.geometry(8, x)[1] for x in (b.block_k, b.block_k_dkv, b.block_k_dq))
        return -(-self.q_len // bq) * bq, -(-self.kv_len // bk) * bk

    def call(self, kernel, which: str, **kw):
        """``pl.pallas_call`` of kernel ``which`` (``"fwd"``, ``"dkv"``, ``"dq"``) with this
        platform's compiler parameters (on GPU: that kernel's warps and stages)."""
        if self.platform == "cpu":
            return pl.pallas_call(kernel, interpret=True, **kw)
        if self.platform in GPU_PLATFORMS:
            from jax.experimental.pallas import triton as plgpu

            warps, stages = getattr(self.launch, which)
            params = plgpu.CompilerParams(num_warps=warps, num_stages=stages)
        else:
            from jax.experimental.pallas import tpu as pltpu

            params = pltpu.CompilerParams(dimension_semantics=("parallel",) * 3)
        return pl.pallas_call(kernel, compiler_params=params, **kw)


# ----------------------------------------------------------------------------------------
# Pieces shared by the three kernels.


class _Block:
    """Scores of one (query block, key block) pair with ALiBi and masks, as ``s [bq,bk]``
    (``q_pos`` a column, ``kv_pos`` a row) or, ``transposed``, as ``s^T [bk,bq]`` (the
    dK/dV kernel's orientation, where every matmul is then in its natural layout)."""

    def __init__(self, st: KernelStatic, offset, slope, bq: int, bk: int, transposed=False):
        self.st, self.offset, self.slope = st, offset, slope
        self.bq, self.bk, self.transposed = bq, bk, transposed

    def scores(self, q, k, q_start, k_start, q_seg, kv_seg, masked):
        """``q [bq,H]``, ``k [bk,H]`` -> float32 scores, masked entries at MASK_VALUE (see
        :mod:`tfmjax.kernels.block_geometry`: no select is needed after the exp)."""
        st, bq, bk = self.st, self.bq, self.bk
        rows, cols = (k, q) if self.transposed else (q, k)
        s = (
            lax.dot_general(
                rows, cols, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )
            * st.scale
        )
        if self.transposed:  # q_pos a row [1,bq], kv_pos a column [bk,1]
            q_pos = lax.broadcasted_iota(jnp.int32, (1, bq), 1)
            kv_pos = lax.broadcasted_iota(jnp.int32, (bk, 1), 0)
        else:  # q_pos a column [bq,1], kv_pos a row [1,bk]
            q_pos = lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
            kv_pos = lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        q_pos = q_pos + (self.offset + q_start)
        kv_pos = kv_pos + k_start
        if self.slope is not None:  # -slope |p - s| is symmetric: rows x cols either way
            row_pos, col_pos = (kv_pos, q_pos) if self.transposed else (q_pos, kv_pos)
            alibi = alibi_bias(self.slope.reshape(1), row_pos[:, 0], col_pos[0, :])
            s = s + alibi.reshape(s.shape)
        if not masked:
            return s
        mask = block_mask(
            q_pos,
            kv_pos,
            **pattern_options(st),
            q_seg=q_seg,
            kv_seg=kv_seg,
            kv_len=st.kv_len if st.kv_len % bk else None,
        )
        return jnp.where(mask, s, MASK_VALUE)


def _unpack(refs, st: KernelStatic, names):
    """Split a kernel's refs into the named fixed ones plus optional seg/slope refs."""
    refs = list(refs)
    out = {n: refs.pop(0) for n in names}
    out["offset"] = refs.pop(0)
    out["q_seg"], out["kv_seg"] = (refs.pop(0), refs.pop(0)) if st.has_seg else (None, None)
    out["slope"] = refs.pop(0) if st.has_alibi else None
    return out, refs  # what is left: the outputs


def _key_ranges(st: KernelStatic, q_start, bq: int, bk: int, nk: int) -> BlockRanges:
    """The key blocks queries ``q_start .. q_start + bq - 1`` visit."""
    if st.static_offset is None:  # traced q_offset: visit every block, all masked
        return BlockRanges(None, None, 0, nk, nk, nk)
    p_lo = st.static_offset + q_start
    return pattern_ranges(
        p_lo,
        p_lo + bq - 1,
        bk,
        nk,
        **pattern_options(st),
        num_full=st.kv_len // bk,
        full_ok=not st.has_seg,
    )


def _query_ranges(st: KernelStatic, k_start, bq: int, bk: int, nq: int) -> BlockRanges:
    """The query blocks keys ``k_start .. k_start + bk - 1`` visit (the dual of the above)."""
    if st.static_offset is None:
        return BlockRanges(None, None, 0, nq, nq, nq)
    a_lo = k_start - st.static_offset  # key positions in query-index units
    ranges = pattern_ranges(
        a_lo,
        a_lo + bk - 1,
        bq,
        nq,
        **pattern_options(st),
        num_full=nq,
        full_ok=not st.has_seg,
        dual_offset=st.static_offset,
    )
    if st.kv_len % bk:  # the last key block holds padding: mask it all
        fhi = jnp.where(k_start + bk > st.kv_len, ranges.flo, ranges.fhi)
        ranges = ranges._replace(fhi=fhi)
    return ranges


# ----------------------------------------------------------------------------------------
# Kernels.


def fwd_kernel(*refs, st: KernelStatic, bq: int, bk: int, nk: int):
    r, (o_ref, lse_ref) = _unpack(refs, st, ("q", "k", "v"))
    q_start = pl.program_id(2) * bq
    blk = _Block(st, r["offset"][...], None if r["slope"] is None else r["slope"][...], bq, bk)
    q = r["q"][...]
    q_seg = None if r["q_seg"] is None else r["q_seg"][...]

    def body(j, carry, masked):
        m, l, acc = carry
        k_start = pl.multiple_of(j * bk, bk)
        kv_seg = None if r["kv_seg"] is None else r["kv_seg"][:, pl.ds(k_start, bk)]
        s = blk.scores(q, r["k"][pl.ds(k_start, bk), :], q_start, k_start, q_seg, kv_seg, masked)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        v = r["v"][pl.ds(k_start, bk), :]
        pv = lax.dot_general(
            p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        return m_new, alpha * l + jnp.sum(p, axis=1, keepdims=True), alpha * acc + pv

    init = (
        jnp.full((bq, 1), ROW_MAX_INIT, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
        jnp.zeros(q.shape, jnp.float32),
    )
    m, l, acc = loop_over_ranges(_key_ranges(st, q_start, bq, bk, nk), body, init)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    o_ref[...] = (acc / l_safe).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), jnp.inf)


def dq_kernel(*refs, st: KernelStatic, bq: int, bk: int, nk: int):
    r, (dq_ref,) = _unpack(refs, st, ("q", "k", "v", "do", "lse", "delta"))
    q_start = pl.program_id(2) * bq
    blk = _Block(st, r["offset"][...], None if r["slope"] is None else r["slope"][...], bq, bk)
    q, do, lse, delta = r["q"][...], r["do"][...], r["lse"][...], r["delta"][...]
    q_seg = None if r["q_seg"] is None else r["q_seg"][...]

    def body(j, dq, masked):
        k_start = pl.multiple_of(j * bk, bk)
        kv_seg = None if r["kv_seg"] is None else r["kv_seg"][:, pl.ds(k_start, bk)]
        k = r["k"][pl.ds(k_start, bk), :]
        v = r["v"][pl.ds(k_start, bk), :]
        p = jnp.exp(blk.scores(q, k, q_start, k_start, q_seg, kv_seg, masked) - lse)
        dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        ds = p * (dp - delta)
        return dq + lax.dot_general(
            ds.astype(k.dtype), k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )

    dq = loop_over_ranges(
        _key_ranges(st, q_start, bq, bk, nk), body, jnp.zeros(q.shape, jnp.float32)
    )
    dq_ref[...] = (dq * st.scale).astype(dq_ref.dtype)


def dkv_kernel(*refs, st: KernelStatic, bq: int, bk: int, nq: int):
    """dK, dV of one key block, in the transposed orientation: ``S^T = K Q^T [bk,bq]``,
    ``dV += P^T dO``, ``dK += dS^T Q``. Row statistics come as rows ``lse, delta [1,bq]``,
    segment ids as ``q_seg [1,Tp]`` and ``kv_seg [bk,1]``."""
    r, (dk_ref, dv_ref) = _unpack(refs, st, ("q", "k", "v", "do", "lse", "delta"))
    k_start = pl.program_id(2) * bk
    k, v = r["k"][...], r["v"][...]
    kv_seg = None if r["kv_seg"] is None else r["kv_seg"][...]
    ranges = _query_ranges(st, k_start, bq, bk, nq)
    nt = (((1,), (1,)), ((), ()))  # A B^T
    nn = (((1,), (0,)), ((), ()))  # A B

    def head(g, carry):
        blk = _Block(
            st,
            r["offset"][...],
            None if r["slope"] is None else r["slope"][g],
            bq,
            bk,
            transposed=True,
        )

        def body(i, carry, masked):
            dk, dv = carry
            q_start = pl.multiple_of(i * bq, bq)
            rows = pl.ds(q_start, bq)
            q_seg = None if r["q_seg"] is None else r["q_seg"][:, rows]
            q, do = r["q"][g, rows, :], r["do"][g, rows, :]
            s_t = blk.scores(q, k, q_start, k_start, q_seg, kv_seg, masked)
            p_t = jnp.exp(s_t - r["lse"][g, :, rows])
            dv = dv + lax.dot_general(
                p_t.astype(do.dtype), do, nn, preferred_element_type=jnp.float32
            )
            dp_t = lax.dot_general(v, do, nt, preferred_element_type=jnp.float32)
            ds_t = p_t * (dp_t - r["delta"][g, :, rows])
            dk = dk + lax.dot_general(
                ds_t.astype(q.dtype), q, nn, preferred_element_type=jnp.float32
            )
            return dk, dv

        return loop_over_ranges(ranges, body, carry)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, st.groups, head, (zeros, zeros))
    dk_ref[...] = (dk * st.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------------------
# pallas_call wrappers. Layouts: q, o, dO [B,N,Tp,Hp]; k, v [B,K,Sp,Hp]; lse, delta
# [B,N,Tp,1]; q_seg [B,Tp,1]; kv_seg [B,1,Sp]; slopes [N,1,1]; offset [1,1].
