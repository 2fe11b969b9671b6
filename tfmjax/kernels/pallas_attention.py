"""FlashAttention in Pallas: forward, dK/dV and dQ kernels behind ``jax.custom_vjp``.

Seed 000 §6.5 / pseudo-algorithm 6.8: one program per (batch, query head, query
block) keeps the running max ``m``, denominator ``l`` and unnormalised output in
float32 while it loops over the key blocks that block can see; it writes ``O`` and
the log-sum-exp ``lse = m + log l``. The backward recomputes ``P = exp(S - lse)``
(FlashAttention-2): a dK/dV kernel (one program per batch, key/value head, key block,
looping over the ``G`` query heads of the group and their query blocks; it works on
``S^T`` so that all its matmuls are in natural layout and ``lse`` is a lane-dense row)
and a dQ kernel (one program per batch, query head, query block, looping over key
blocks). ``delta = rowsum(dO * O)`` is a plain XLA reduction. No atomics, no T x S
buffers; dK/dV of a group are summed in-kernel, so nothing is repeated per query head.

Backends (kernel flavours):
  * ``"cuda"`` / ``"gpu"`` / ``"rocm"``: **Triton** (``jax.experimental.pallas.triton``), the
    portable GPU lowering of jax 0.10 (any CUDA GPU; Mosaic GPU, jax's other GPU backend, is
    Hopper/Blackwell-only and needs a different, warp-group kernel style). Custom-call
    target ``__gpu$xla.gpu.triton`` (not on ``jax.export``'s stable list: export with
    ``jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")``).
  * ``"tpu"``: **Mosaic TPU** (``jax.experimental.pallas.tpu``), the only TPU backend.
    Custom-call target ``tpu_custom_call`` (on the stable list).
  * ``"cpu"``: the same kernels with ``interpret=True`` (slow, for tests): plain HLO, each
    grid a ``while`` loop named after its kernel (``tfmjax_flash_fwd/while``...).

How the flavour is chosen: with ``platform=None`` (the default, and what
``tfmjax.kernels.attention(impl="pallas")`` and models pass) it is chosen when the
computation is **lowered**, not from the default backend at trace time: :func:`attention`
wraps the flavours in ``jax.lax.platform_dependent(q, k, v, cpu=..., cuda=..., rocm=...,
tpu=...)`` (forward and backward alike: each branch holds its own ``custom_vjp``), and
lowering for one platform keeps that platform's branch only. So
``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` or ``jax.export`` for
``("tpu",)`` from a CPU host carries Triton or Mosaic kernels and no interpreter. Under
``jit`` every flavour is traced (about 0.1 s each per new shape; traced kernels are cached
per shape and options); an eager call evaluates the platform index and traces the default
backend's flavour only. An explicit ``platform=`` builds that flavour alone (no dispatch;
lowering it for another platform fails). A joint multi-platform lowering (e.g.
``lowering_platforms=("cpu", "cuda")``) is not supported: jax lowers every ``pallas_call``
of the module for each of its platforms, and each flavour's call lowers for its own only.

Features: causal masks and sliding windows skip whole blocks (the loop runs only over
the needed key blocks, and only blocks on the edge of the visible band build a mask);
segment ids (padding and packing); GQA/MQA by index mapping (a query head reads key/value
head ``n // G``; nothing is repeated); ALiBi slopes applied in-kernel per block; ``T``
and ``S`` padded up to the blocks (padded keys masked, padded queries dropped); ``H``
padded to a power of two. Block geometry and masks are the ones of
:mod:`tfmjax.kernels.blockwise` (:func:`~tfmjax.kernels.blockwise.block_range`,
:func:`~tfmjax.kernels.blockwise.block_mask`, i.e. :func:`tfmjax.kernels.masks.allowed`).

Limits: the loops over blocks run inside each program, over refs that hold the whole
sequence of one head (forward and dQ: K and V; dK/dV: Q, dO of the group) — on GPU that
is global memory read block by block; on TPU those refs are VMEM blocks, so with the
default 16-32 MiB of scoped VMEM this suits S up to a few thousand at H=128 (longer
sequences want jax's grid-over-KV TPU pipeline, ``ops/tpu/flash_attention.py``). Block
shapes follow TPU tiling (multiples of 8 x 128 or full dims) and Triton's powers of two.
A traced ``q_offset`` (decoding) is supported but disables block skipping. ALiBi slopes,
segment ids and ``q_offset`` get no gradient. Lowering for both platforms is tested on
CPU (CI has no device). Triton was run once by hand on an H100 (jax 0.11.2): with
``jax_default_matmul_precision="highest"`` fp32 outputs and gradients were within 1e-5 of
the reference (default precision: TF32 dots, ~1e-3), and a model exported for ``("cuda",)``
on a CPU host ran there. Mosaic TPU has not been compiled or run (no TPU).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tfmjax.kernels import PALLAS_FLAVOUR, masks
from tfmjax.kernels.blockwise import (MASK_VALUE, ROW_MAX_INIT, block_mask, block_range, distance_bounds,
                                      loop_over_ranges)

_GPU = ("cuda", "gpu", "rocm")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Block lengths (powers of two) of the forward, dK/dV and dQ kernels.

    Blocks are clipped to the (power-of-two rounded) sequence lengths, so short inputs
    use one block. Triton needs blocks of at least 16. On TPU, blocks sliced along the
    lane dimension inside a kernel (``block_k``/``block_k_dq`` with segment ids,
    ``block_q_dkv`` always) should be multiples of 128 unless they span the sequence.
    :meth:`for_platform` gives the defaults (not tuned on hardware here: no GPU/TPU).
    """
    block_q: int = 128
    block_k: int = 128
    block_q_dkv: int = 128
    block_k_dkv: int = 128
    block_q_dq: int = 128
    block_k_dq: int = 128

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"BlockSizes.{f.name}={value!r} must be a power of two")

    @classmethod
    def for_platform(cls, platform: str) -> BlockSizes:
        """GPU: the FlashAttention-2 Triton tutorial's tiles (fwd 128x64; dK/dV: 32 query
        rows per 128 keys; dQ: 128 query rows per 32 keys). TPU and CPU: 128 everywhere
        (one MXU tile / 128 lanes, as jax's own TPU flash attention)."""
        if _platform(platform) == "cuda":
            return cls(block_q=128, block_k=64, block_q_dkv=32, block_k_dkv=128,
                       block_q_dq=128, block_k_dq=32)
        return cls()


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything static about a call (the custom_vjp's nondiff argument)."""
    causal: bool
    window: int | None
    scale: float
    q_len: int
    kv_len: int
    static_offset: int | None    # None: q_offset is traced, no block skipping
    has_seg: bool
    has_alibi: bool
    groups: int                  # G = N / K
    blocks: BlockSizes
    platform: str                # "cpu" (interpret), "cuda", "tpu"

    def geometry(self, block_q: int, block_k: int):
        """``bq, bk`` clipped to the lengths; ``nq, nk``: blocks holding real rows."""
        bq = min(block_q, max(_pow2(self.q_len), 8))
        bk = min(block_k, max(_pow2(self.kv_len), 8))
        return bq, bk, -(-self.q_len // bq), -(-self.kv_len // bk)

    @property
    def padded_lens(self):
        """Padded ``T``, ``S``: multiples of every block size used by the three kernels."""
        b = self.blocks
        bq = max(self.geometry(x, 8)[0] for x in (b.block_q, b.block_q_dkv, b.block_q_dq))
        bk = max(self.geometry(8, x)[1] for x in (b.block_k, b.block_k_dkv, b.block_k_dq))
        return -(-self.q_len // bq) * bq, -(-self.kv_len // bk) * bk

    def call(self, kernel, **kw):
        """``pl.pallas_call`` with this platform's compiler parameters."""
        if self.platform == "cpu":
            return pl.pallas_call(kernel, interpret=True, **kw)
        if self.platform in _GPU:
            from jax.experimental.pallas import triton as plgpu
            params = plgpu.CompilerParams(num_warps=4, num_stages=2)
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

    def __init__(self, st: _Static, offset, slope, bq: int, bk: int, transposed=False):
        self.st, self.offset, self.slope = st, offset, slope
        self.bq, self.bk, self.transposed = bq, bk, transposed

    def scores(self, q, k, q_start, k_start, q_seg, kv_seg, masked):
        """``q [bq,H]``, ``k [bk,H]`` -> float32 scores, masked entries at MASK_VALUE (see
        :mod:`tfmjax.kernels.blockwise`: no select is needed after the exp)."""
        st, bq, bk = self.st, self.bq, self.bk
        rows, cols = (k, q) if self.transposed else (q, k)
        s = lax.dot_general(rows, cols, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * st.scale
        if self.transposed:      # q_pos a row [1,bq], kv_pos a column [bk,1]
            q_pos = lax.broadcasted_iota(jnp.int32, (1, bq), 1)
            kv_pos = lax.broadcasted_iota(jnp.int32, (bk, 1), 0)
        else:                    # q_pos a column [bq,1], kv_pos a row [1,bk]
            q_pos = lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
            kv_pos = lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        q_pos = q_pos + (self.offset + q_start)
        kv_pos = kv_pos + k_start
        if self.slope is not None:       # -slope |p - s| is symmetric: rows x cols either way
            row_pos, col_pos = (kv_pos, q_pos) if self.transposed else (q_pos, kv_pos)
            alibi = masks.alibi_bias(self.slope.reshape(1), row_pos[:, 0], col_pos[0, :])
            s = s + alibi.reshape(s.shape)
        if not masked:
            return s
        mask = block_mask(q_pos, kv_pos, causal=st.causal, window=st.window, q_seg=q_seg,
                          kv_seg=kv_seg, kv_len=st.kv_len if st.kv_len % bk else None)
        return jnp.where(mask, s, MASK_VALUE)


def _unpack(refs, st: _Static, names):
    """Split a kernel's refs into the named fixed ones plus optional seg/slope refs."""
    refs = list(refs)
    out = {n: refs.pop(0) for n in names}
    out["offset"] = refs.pop(0)
    out["q_seg"], out["kv_seg"] = (refs.pop(0), refs.pop(0)) if st.has_seg else (None, None)
    out["slope"] = refs.pop(0) if st.has_alibi else None
    return out, refs           # what is left: the outputs


def _key_ranges(st: _Static, q_start, bq: int, bk: int, nk: int):
    """Key-block ranges ``lo, flo, fhi, hi`` for queries ``q_start .. q_start + bq - 1``."""
    if st.static_offset is None:         # traced q_offset: visit every block, all masked
        return 0, nk, nk, nk
    p_lo = st.static_offset + q_start
    return block_range(p_lo, p_lo + bq - 1, bk, nk, *distance_bounds(st.causal, st.window),
                       num_full=st.kv_len // bk, full_ok=not st.has_seg)


def _query_ranges(st: _Static, k_start, bq: int, bk: int, nq: int):
    """Query-block ranges for keys ``k_start .. k_start + bk - 1`` (the dual of the above)."""
    if st.static_offset is None:
        return 0, nq, nq, nq
    dmin, dmax = distance_bounds(st.causal, st.window)
    a_lo = k_start - st.static_offset               # key positions in query-index units
    lo, flo, fhi, hi = block_range(a_lo, a_lo + bk - 1, bq, nq,
                                   None if dmax is None else -dmax,
                                   None if dmin is None else -dmin,
                                   num_full=nq, full_ok=not st.has_seg)
    if st.kv_len % bk:                   # the last key block holds padding: mask it all
        fhi = jnp.where(k_start + bk > st.kv_len, flo, fhi)
    return lo, flo, fhi, hi


# ----------------------------------------------------------------------------------------
# Kernels.

def _fwd_kernel(*refs, st: _Static, bq: int, bk: int, nk: int):
    r, (o_ref, lse_ref) = _unpack(refs, st, ("q", "k", "v"))
    q_start = pl.program_id(2) * bq
    blk = _Block(st, r["offset"][...], None if r["slope"] is None else r["slope"][...], bq, bk)
    q = r["q"][...]
    q_seg = None if r["q_seg"] is None else r["q_seg"][...]

    def body(j, carry, masked):
        m, l, acc = carry
        k_start = pl.multiple_of(j * bk, bk)
        kv_seg = None if r["kv_seg"] is None else r["kv_seg"][:, pl.ds(k_start, bk)]
        s = blk.scores(q, r["k"][pl.ds(k_start, bk), :], q_start, k_start, q_seg, kv_seg,
                       masked)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        v = r["v"][pl.ds(k_start, bk), :]
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
        return m_new, alpha * l + jnp.sum(p, axis=1, keepdims=True), alpha * acc + pv

    init = (jnp.full((bq, 1), ROW_MAX_INIT, jnp.float32), jnp.zeros((bq, 1), jnp.float32),
            jnp.zeros(q.shape, jnp.float32))
    m, l, acc = loop_over_ranges(*_key_ranges(st, q_start, bq, bk, nk), body, init)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    o_ref[...] = (acc / l_safe).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), jnp.inf)


def _dq_kernel(*refs, st: _Static, bq: int, bk: int, nk: int):
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
        return dq + lax.dot_general(ds.astype(k.dtype), k, (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    dq = loop_over_ranges(*_key_ranges(st, q_start, bq, bk, nk), body,
                          jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * st.scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, st: _Static, bq: int, bk: int, nq: int):
    """dK, dV of one key block, in the transposed orientation: ``S^T = K Q^T [bk,bq]``,
    ``dV += P^T dO``, ``dK += dS^T Q``. Row statistics come as rows ``lse, delta [1,bq]``,
    segment ids as ``q_seg [1,Tp]`` and ``kv_seg [bk,1]``."""
    r, (dk_ref, dv_ref) = _unpack(refs, st, ("q", "k", "v", "do", "lse", "delta"))
    k_start = pl.program_id(2) * bk
    k, v = r["k"][...], r["v"][...]
    kv_seg = None if r["kv_seg"] is None else r["kv_seg"][...]
    ranges = _query_ranges(st, k_start, bq, bk, nq)
    nt = (((1,), (1,)), ((), ()))        # A B^T
    nn = (((1,), (0,)), ((), ()))        # A B

    def head(g, carry):
        blk = _Block(st, r["offset"][...], None if r["slope"] is None else r["slope"][g],
                     bq, bk, transposed=True)

        def body(i, carry, masked):
            dk, dv = carry
            q_start = pl.multiple_of(i * bq, bq)
            rows = pl.ds(q_start, bq)
            q_seg = None if r["q_seg"] is None else r["q_seg"][:, rows]
            q, do = r["q"][g, rows, :], r["do"][g, rows, :]
            s_t = blk.scores(q, k, q_start, k_start, q_seg, kv_seg, masked)
            p_t = jnp.exp(s_t - r["lse"][g, :, rows])
            dv = dv + lax.dot_general(p_t.astype(do.dtype), do, nn,
                                      preferred_element_type=jnp.float32)
            dp_t = lax.dot_general(v, do, nt, preferred_element_type=jnp.float32)
            ds_t = p_t * (dp_t - r["delta"][g, :, rows])
            dk = dk + lax.dot_general(ds_t.astype(q.dtype), q, nn,
                                      preferred_element_type=jnp.float32)
            return dk, dv

        return loop_over_ranges(*ranges, body, carry)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, st.groups, head, (zeros, zeros))
    dk_ref[...] = (dk * st.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------------------
# pallas_call wrappers. Layouts: q, o, dO [B,N,Tp,Hp]; k, v [B,K,Sp,Hp]; lse, delta
# [B,N,Tp,1]; q_seg [B,Tp,1]; kv_seg [B,1,Sp]; slopes [N,1,1]; offset [1,1].

def _extras_specs(st: _Static, q_seg_spec, kv_seg_spec, slope_spec):
    specs = [pl.BlockSpec((1, 1), lambda b, h, i: (0, 0))]
    if st.has_seg:
        specs += [q_seg_spec, kv_seg_spec]
    if st.has_alibi:
        specs.append(slope_spec)
    return specs


def _extras(offset, q_seg, kv_seg, slopes):
    return [offset] + ([q_seg, kv_seg] if q_seg is not None else []) + (
        [slopes] if slopes is not None else [])


def _query_block_specs(st: _Static, bq: int, Sp: int, Hp: int):
    """Block specs of a grid over (batch b, query head h, query block i), as the forward
    and dQ kernels use: ``q``-shaped blocks, the whole K/V of head ``h // G``, per-row
    statistics, and the extras (offset, segment ids, ALiBi slope)."""
    G = st.groups
    q_spec = pl.BlockSpec((None, None, bq, Hp), lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, Sp, Hp), lambda b, h, i: (b, lax.div(h, G), 0, 0))
    row_spec = pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0))
    extras = _extras_specs(st, pl.BlockSpec((None, bq, 1), lambda b, h, i: (b, i, 0)),
                           pl.BlockSpec((None, 1, Sp), lambda b, h, i: (b, 0, 0)),
                           pl.BlockSpec((None, 1, 1), lambda b, h, i: (h, 0, 0)))
    return q_spec, kv_spec, row_spec, extras


def _forward(st: _Static, q, k, v, offset, q_seg, kv_seg, slopes):
    B, N, Tp, Hp = q.shape
    Sp = k.shape[2]
    bq, bk, _, nk = st.geometry(st.blocks.block_q, st.blocks.block_k)
    q_spec, kv_spec, row_spec, extras = _query_block_specs(st, bq, Sp, Hp)
    return st.call(
        functools.partial(_fwd_kernel, st=st, bq=bq, bk=bk, nk=nk),
        grid=(B, N, Tp // bq),
        in_specs=[q_spec, kv_spec, kv_spec] + extras,
        out_specs=[q_spec, row_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((B, N, Tp, 1), jnp.float32)],
        name="tfmjax_flash_fwd",
    )(q, k, v, *_extras(offset, q_seg, kv_seg, slopes))


def _backward(st: _Static, res, d_out):
    q, k, v, offset, q_seg, kv_seg, slopes, out, lse = res
    B, N, Tp, Hp = q.shape
    K, Sp, G = k.shape[1], k.shape[2], st.groups
    delta = jnp.einsum("BNTH,BNTH->BNT", out.astype(jnp.float32),
                       d_out.astype(jnp.float32))[..., None]
    d_out = d_out.astype(q.dtype)
    extra_args = _extras(offset, q_seg, kv_seg, slopes)

    # dQ: one program per (b, query head n, query block i), looping over key blocks.
    bq, bk, _, nk = st.geometry(st.blocks.block_q_dq, st.blocks.block_k_dq)
    q_spec, kv_spec, row_spec, extras = _query_block_specs(st, bq, Sp, Hp)
    dq = st.call(
        functools.partial(_dq_kernel, st=st, bq=bq, bk=bk, nk=nk),
        grid=(B, N, Tp // bq),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec] + extras,
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        name="tfmjax_flash_dq",
    )(q, k, v, d_out, lse, delta, *extra_args)

    # dK, dV: one program per (b, key/value head h, key block j), looping over the G
    # query heads h*G .. h*G+G-1 and their query blocks. Row statistics and segment ids
    # are transposed for the kernel's S^T orientation: lse, delta [B,N,1,Tp] (lane-dense
    # rows), q_seg [B,1,Tp], kv_seg [B,Sp,1].
    bq, bk, nq, _ = st.geometry(st.blocks.block_q_dkv, st.blocks.block_k_dkv)
    group_spec = pl.BlockSpec((None, G, Tp, Hp), lambda b, h, j: (b, h, 0, 0))
    group_rows = pl.BlockSpec((None, G, 1, Tp), lambda b, h, j: (b, h, 0, 0))
    kv_spec = pl.BlockSpec((None, None, bk, Hp), lambda b, h, j: (b, h, j, 0))
    extras = _extras_specs(st, pl.BlockSpec((None, 1, Tp), lambda b, h, j: (b, 0, 0)),
                           pl.BlockSpec((None, bk, 1), lambda b, h, j: (b, j, 0)),
                           pl.BlockSpec((G, 1, 1), lambda b, h, j: (h, 0, 0)))
    rows_t = lambda x: jnp.swapaxes(x, -1, -2)  # noqa: E731
    extra_args = _extras(offset, None if q_seg is None else rows_t(q_seg),
                         None if kv_seg is None else rows_t(kv_seg), slopes)
    dk, dv = st.call(
        functools.partial(_dkv_kernel, st=st, bq=bq, bk=bk, nq=nq),
        grid=(B, K, Sp // bk),
        in_specs=[group_spec, kv_spec, kv_spec, group_spec, group_rows, group_rows] + extras,
        out_specs=[kv_spec, kv_spec],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        name="tfmjax_flash_dkv",
    )(q, k, v, d_out, rows_t(lse), rows_t(delta), *extra_args)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st, q, k, v, offset, q_seg, kv_seg, slopes):
    return _forward(st, q, k, v, offset, q_seg, kv_seg, slopes)[0]


def _flash_fwd(st, q, k, v, offset, q_seg, kv_seg, slopes):
    out, lse = _forward(st, q, k, v, offset, q_seg, kv_seg, slopes)
    return out, (q, k, v, offset, q_seg, kv_seg, slopes, out, lse)


def _flash_bwd(st, res, d_out):
    dq, dk, dv = _backward(st, res, d_out)
    slopes = res[6]
    return dq, dk, dv, None, None, None, None if slopes is None else jnp.zeros_like(slopes)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _platform(platform: str | None) -> str:
    """The kernel flavour of a platform name: ``"cpu"`` (interpret), ``"cuda"`` (Triton, also
    for ``"gpu"``/``"rocm"``) or ``"tpu"`` (Mosaic); None: the default backend's."""
    platform = (platform or jax.default_backend()).lower()
    if platform in _GPU:
        return "cuda"
    if platform in ("cpu", "tpu"):
        return platform
    raise ValueError(f"pallas attention: unknown platform {platform!r}; "
                     "use 'cpu' (interpret mode), 'cuda'/'gpu' (Triton) or 'tpu' (Mosaic)")


def _static_offset(q_offset):
    try:
        return int(q_offset)
    except (jax.errors.ConcretizationTypeError, TypeError):
        return None


def _triton_blocks_ok(blocks: BlockSizes) -> bool:
    return min(dataclasses.astuple(blocks)) >= 16


def _check_triton_blocks(blocks: BlockSizes):
    if not _triton_blocks_ok(blocks):
        raise ValueError(f"pallas attention on GPU (Triton) needs blocks >= 16, got {blocks}")


def attention(q, k, v, *, causal, q_segment_ids, kv_segment_ids, window, alibi_slopes,
              bias, q_offset, scale, block_sizes: BlockSizes | None = None,
              platform: str | None = None):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]`` with the Pallas kernels.

    ``platform`` picks the kernels. None (default): chosen when the computation is lowered,
    with ``lax.platform_dependent`` -- Triton for ``cuda``/``rocm``, Mosaic for ``tpu``, the
    interpreter for ``cpu`` -- so ``jax.jit(f).trace(...).lower(lowering_platforms=("tpu",))``
    or ``jax.export`` for one platform from any host keeps only that platform's kernels
    (under ``jit`` every flavour is traced, only the lowered one is kept; an eager call runs
    the default backend's alone). ``"cpu"``, ``"cuda"``/``"gpu"``/``"rocm"`` or ``"tpu"``:
    build that flavour only, with no dispatch (lowering it for another platform fails).

    ``block_sizes`` (default: :meth:`BlockSizes.for_platform` of each flavour) applies to every
    flavour; blocks under 16, which Triton cannot take, leave ``platform=None`` without a GPU
    flavour (lowering for ``cuda``/``rocm`` then fails; on a GPU host this raises at once).
    """
    if bias is not None:
        raise ValueError("impl='pallas' takes structured masks only; a dense bias needs "
                         "impl='xla' or 'reference'")
    kw = dict(causal=causal, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
              window=window, alibi_slopes=alibi_slopes, q_offset=q_offset, scale=scale,
              block_sizes=block_sizes)
    if platform is not None:
        return _attention(_platform(platform), q, k, v, **kw)
    flavours = {}                    # one callable per flavour: cuda and rocm share a branch
    for name in dict.fromkeys(PALLAS_FLAVOUR.values()):
        blocks = block_sizes or BlockSizes.for_platform(name)
        if name == "cuda" and not _triton_blocks_ok(blocks):
            if jax.default_backend() in _GPU:
                _check_triton_blocks(blocks)
            continue
        flavours[name] = functools.partial(_attention, name, **kw)
    branches = {p: flavours[name] for p, name in PALLAS_FLAVOUR.items() if name in flavours}
    # q, k, v go through as operands; the rest is closed over (a Python q_offset stays
    # static, so block skipping survives).
    return lax.platform_dependent(q, k, v, **branches)


def _attention(platform: str, q, k, v, *, causal, q_segment_ids, kv_segment_ids, window,
               alibi_slopes, q_offset, scale, block_sizes: BlockSizes | None):
    """The kernels of one flavour (``platform``: ``"cpu"``, ``"cuda"`` or ``"tpu"``)."""
    blocks = block_sizes or BlockSizes.for_platform(platform)
    if platform == "cuda":
        _check_triton_blocks(blocks)
    static_offset = _static_offset(q_offset)
    return _kernels(q, k, v, q_segment_ids, kv_segment_ids, alibi_slopes,
                    q_offset if static_offset is None else None, platform=platform,
                    causal=bool(causal), window=None if window is None else int(window),
                    scale=float(scale), blocks=blocks, static_offset=static_offset)


# A jit of its own so that tracing the kernels is cached: a call with the same shapes and
# options (the layers of an unrolled model, a re-traced step) reuses the traced kernels.
@functools.partial(jax.jit, static_argnames=("platform", "causal", "window", "scale", "blocks",
                                             "static_offset"))
def _kernels(q, k, v, q_segment_ids, kv_segment_ids, alibi_slopes, q_offset, *, platform,
             causal, window, scale, blocks, static_offset):
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    st = _Static(causal=causal, window=window, scale=scale, q_len=T, kv_len=S,
                 static_offset=static_offset, has_seg=q_segment_ids is not None,
                 has_alibi=alibi_slopes is not None, groups=N // K, blocks=blocks,
                 platform=platform)
    Tp, Sp = st.padded_lens
    Hp = max(_pow2(H), 16 if platform == "cuda" else 1)

    def pad(x, length):      # [B,L,heads,H] -> [B,heads,Lp,Hp], zero padded
        x = jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, Hp - H)))
        return x.transpose(0, 2, 1, 3)

    q_seg = kv_seg = None
    if q_segment_ids is not None:
        q_seg = jnp.pad(q_segment_ids.astype(jnp.int32), ((0, 0), (0, Tp - T)))[:, :, None]
        kv_seg = jnp.pad(kv_segment_ids.astype(jnp.int32), ((0, 0), (0, Sp - S)))[:, None, :]
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.astype(jnp.float32).reshape(N, 1, 1)
    offset = jnp.asarray(static_offset if q_offset is None else q_offset,
                         jnp.int32).reshape(1, 1)
    out = _flash(st, pad(q, Tp), pad(k, Sp), pad(v, Sp), offset, q_seg, kv_seg, slopes)
    return out.transpose(0, 2, 1, 3)[:, :T, :, :H]
