"""Blockwise attention in pure JAX: seed 000 §6.5 / pseudo-algorithm 6.8 (FlashAttention).

Queries are cut into blocks of ``block_q`` rows and keys into blocks of ``block_k``
columns. For each query block a loop over key blocks keeps the running row maximum
``m``, the running denominator ``l`` and the unnormalised output ``O`` (the online
softmax recurrence of §6.5), so no ``T x S`` array ever exists. The result is exact.

* **Block skipping.** Causal masks and sliding windows bound the distance
  ``d = p - s`` between a query position ``p`` and a key position ``s``;
  :func:`block_range` turns that into the range of key blocks a query block needs,
  and the sub-range it sees entirely. The inner loop runs only over the needed
  range (its bounds are traced scalars, so a traced ``q_offset`` skips too), and
  only blocks on the edge of the range pay for building and applying a mask.
* **Backward.** ``jax.custom_vjp``: the forward saves only ``O`` and the row
  log-sum-exp ``lse = m + log l``; the backward recomputes ``P = exp(S - lse)`` block
  by block (FlashAttention-2), in one pass: outer loop over query blocks carrying
  ``dK, dV`` for the whole key length, inner loop over the needed key blocks
  carrying the block's ``dQ``. Five matmuls per block pair; residuals are O(T).
* **GQA / MQA.** The ``G = N / K`` query heads that share a key/value head are
  batched into the same matmul (``BKGTH,BKSH->BKGTS``): K and V are never repeated.
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

import jax
import jax.numpy as jnp
from jax import lax

from tfmjax.kernels import masks

# Masked scores are set to this finite value (not -inf) so a row whose blocks so far
# are all masked keeps a finite running max; its probabilities are zeroed explicitly.
MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Query/key block lengths of the forward and the backward pass.

    The defaults were measured with ``bench/attention.py`` on a 2-core CPU
    (B=1, N=8, H=64): bigger blocks make bigger matmuls, smaller ones waste less
    on the diagonal of a causal mask. ``None`` backward sizes reuse the forward's.
    """
    block_q: int = 512
    block_k: int = 512
    block_q_bwd: int | None = None
    block_k_bwd: int | None = None

    def __post_init__(self):
        for name in ("block_q", "block_k", "block_q_bwd", "block_k_bwd"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"BlockSizes.{name}={value!r} must be a positive int")

    def backward(self) -> BlockSizes:
        return BlockSizes(self.block_q_bwd or self.block_q, self.block_k_bwd or self.block_k)


# ----------------------------------------------------------------------------------------
# Block geometry, shared with pallas_attention.py.

def distance_bounds(causal: bool, window: int | None):
    """Bounds ``(dmin, dmax)`` on ``d = p - s`` for a visible pair (None = unbounded).

    The same rule as :func:`masks.allowed`: causal is ``s <= p`` (``d >= 0``), a window
    is ``|d| <= window``.
    """
    dmin = 0 if causal else (None if window is None else -window)
    dmax = None if window is None else window
    return dmin, dmax


def block_range(a_lo, a_hi, block: int, num_blocks: int, dmin, dmax, *,
                num_full: int, full_ok: bool = True):
    """Which blocks of the other axis positions ``a_lo..a_hi`` of this axis need.

    The other axis has blocks ``b`` covering positions ``b*block .. b*block+block-1``;
    a pair is visible iff ``a - x`` lies in ``[dmin, dmax]``. Returns traced int32
    ``lo <= flo <= fhi <= hi``: blocks in ``[lo, hi)`` hold at least one visible pair,
    blocks in ``[flo, fhi)`` only visible pairs (so need no mask). ``num_full``: how many
    leading blocks hold no padding; ``full_ok=False`` (segment ids) marks every block
    as needing a mask. ``a_lo``, ``a_hi`` may be traced scalars.
    """
    div = jnp.floor_divide
    a_lo = jnp.asarray(a_lo, jnp.int32)
    a_hi = jnp.asarray(a_hi, jnp.int32)
    zero, top = jnp.int32(0), jnp.int32(num_blocks)
    lo = zero if dmax is None else jnp.clip(div(a_lo - dmax, block), 0, num_blocks)
    hi = top if dmin is None else jnp.clip(div(a_hi - dmin, block) + 1, 0, num_blocks)
    hi = jnp.maximum(hi, lo)
    if not full_ok:
        return lo, hi, hi, hi
    flo = lo if dmax is None else -div(dmax - a_hi, block)          # ceil((a_hi - dmax) / block)
    fhi = jnp.int32(num_full) if dmin is None else div(a_lo - dmin + 1, block)
    fhi = jnp.minimum(fhi, num_full)
    flo = jnp.clip(flo, lo, hi)
    fhi = jnp.clip(fhi, flo, hi)
    return lo, flo, fhi, hi


def block_mask(q_pos, kv_pos, *, causal, window, q_seg=None, kv_seg=None, kv_len=None):
    """:func:`masks.allowed` for one block, also masking padded keys ``kv_pos >= kv_len``."""
    ok = masks.allowed(q_pos, kv_pos, causal=causal, window=window, q_seg=q_seg, kv_seg=kv_seg)
    if kv_len is not None:
        ok = ok & (kv_pos < kv_len)
    return ok


def padded_len(length: int, block: int) -> int:
    return -(-length // block) * block


def loop_over_ranges(lo, flo, fhi, hi, body, carry):
    """``body(j, carry, masked)`` over ``[lo, flo)`` and ``[fhi, hi)`` masked, ``[flo, fhi)`` not."""
    carry = lax.fori_loop(lo, flo, functools.partial(body, masked=True), carry)
    carry = lax.fori_loop(flo, fhi, functools.partial(body, masked=False), carry)
    return lax.fori_loop(fhi, hi, functools.partial(body, masked=True), carry)


# ----------------------------------------------------------------------------------------
# The blockwise computation.

@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything static about one call (hashable: the custom_vjp's nondiff argument)."""
    causal: bool
    window: int | None
    scale: float
    q_len: int
    kv_len: int
    block_q: int
    block_k: int
    bwd_block_q: int
    bwd_block_k: int


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """Geometry of one pass: block sizes, block counts, padding."""
    bq: int
    bk: int
    nq: int
    nk: int
    st: _Static

    @classmethod
    def make(cls, st: _Static, bq: int, bk: int) -> _Blocks:
        bq, bk = min(bq, st.q_len), min(bk, st.kv_len)
        return cls(bq, bk, -(-st.q_len // bq), -(-st.kv_len // bk), st)

    @property
    def kv_padded(self) -> bool:
        return self.nk * self.bk != self.st.kv_len

    def q_blocks(self, x):
        """``[B,T,N,H]`` -> ``[nq,B,K,G,bq,H]`` (K, G from ``self.heads``)."""
        B, T, N, H = x.shape
        x = jnp.pad(x, ((0, 0), (0, self.nq * self.bq - T), (0, 0), (0, 0)))
        x = x.reshape(B, self.nq, self.bq, self.heads[0], self.heads[1], H)
        return x.transpose(1, 0, 3, 4, 2, 5)

    def q_unblocks(self, x):
        """``[nq,B,K,G,bq,H]`` -> ``[B,T,N,H]``."""
        nq, B, K, G, bq, H = x.shape
        x = x.transpose(1, 0, 4, 2, 3, 5).reshape(B, nq * bq, K * G, H)
        return x[:, :self.st.q_len]

    def row_blocks(self, x):
        """``[B,T,N]`` -> ``[nq,B,K,G,bq]``."""
        B, T, N = x.shape
        x = jnp.pad(x, ((0, 0), (0, self.nq * self.bq - T), (0, 0)))
        x = x.reshape(B, self.nq, self.bq, self.heads[0], self.heads[1])
        return x.transpose(1, 0, 3, 4, 2)

    def row_unblocks(self, x):
        nq, B, K, G, bq = x.shape
        return x.transpose(1, 0, 4, 2, 3).reshape(B, nq * bq, K * G)[:, :self.st.q_len]

    def kv_blocks(self, x):
        """``[B,S,K,H]`` -> ``[nk,B,K,bk,H]``."""
        B, S, K, H = x.shape
        x = jnp.pad(x, ((0, 0), (0, self.nk * self.bk - S), (0, 0), (0, 0)))
        return x.reshape(B, self.nk, self.bk, K, H).transpose(1, 0, 3, 2, 4)

    def kv_unblocks(self, x):
        nk, B, K, bk, H = x.shape
        return x.transpose(1, 0, 3, 2, 4).reshape(B, nk * bk, K, H)[:, :self.st.kv_len]

    def seg_blocks(self, seg, length, block, n):
        """``[B,L]`` segment ids -> ``[n,B,block]``, padded with 0 (= padding)."""
        if seg is None:
            return None
        seg = jnp.pad(seg, ((0, 0), (0, n * block - length)))
        return seg.reshape(seg.shape[0], n, block).transpose(1, 0, 2)

    heads: tuple = (1, 1)

    def with_heads(self, K, G):
        return dataclasses.replace(self, heads=(K, G))


class _Scores:
    """Scores of one (query block, key block) pair: ``[B,K,G,bq,bk]`` float32."""

    def __init__(self, geo: _Blocks, offset, q_seg, kv_seg, slopes):
        self.geo, self.offset, self.slopes = geo, offset, slopes
        self.q_seg, self.kv_seg = q_seg, kv_seg      # [nq,B,bq], [nk,B,bk] or None
        st = geo.st
        self.dmin, self.dmax = distance_bounds(st.causal, st.window)

    def ranges(self, i):
        """Key-block ranges ``lo, flo, fhi, hi`` for query block ``i``."""
        geo = self.geo
        p_lo = self.offset + i * geo.bq
        return block_range(p_lo, p_lo + geo.bq - 1, geo.bk, geo.nk, self.dmin, self.dmax,
                           num_full=geo.st.kv_len // geo.bk, full_ok=self.q_seg is None)

    def __call__(self, qb, kb, i, j, masked):
        """Scaled scores, ALiBi added, masked positions at MASK_VALUE; and the mask."""
        geo, st = self.geo, self.geo.st
        K, G = geo.heads
        s = jnp.einsum("BKGTH,BKSH->BKGTS", qb, kb, preferred_element_type=jnp.float32)
        s = s * st.scale
        q_pos = self.offset + i * geo.bq + jnp.arange(geo.bq, dtype=jnp.int32)
        kv_pos = j * geo.bk + jnp.arange(geo.bk, dtype=jnp.int32)
        if self.slopes is not None:
            alibi = masks.alibi_bias(self.slopes, q_pos, kv_pos)          # [N,bq,bk]
            s = s + alibi.reshape(1, K, G, geo.bq, geo.bk)
        if not masked:
            return s, None
        q_seg = kv_seg = None
        if self.q_seg is not None:
            q_seg = self.q_seg[i][:, None, None, :, None]                # [B,1,1,bq,1]
            kv_seg = self.kv_seg[j][:, None, None, None, :]              # [B,1,1,1,bk]
        mask = block_mask(q_pos[None, None, None, :, None], kv_pos[None, None, None, None, :],
                          causal=st.causal, window=st.window, q_seg=q_seg, kv_seg=kv_seg,
                          kv_len=st.kv_len if geo.kv_padded else None)
        return jnp.where(mask, s, MASK_VALUE), mask


def _forward(st: _Static, q, k, v, q_seg, kv_seg, slopes, offset):
    """Returns ``out [B,T,N,H]`` (q's dtype) and ``lse [B,T,N]`` (float32, +inf if empty)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    geo = _Blocks.make(st, st.block_q, st.block_k).with_heads(K, N // K)
    scores = _Scores(geo, offset, geo.seg_blocks(q_seg, T, geo.bq, geo.nq),
                     geo.seg_blocks(kv_seg, st.kv_len, geo.bk, geo.nk), slopes)
    k_b, v_b = geo.kv_blocks(k), geo.kv_blocks(v)

    def q_block(_, xs):
        qb, i = xs

        def body(j, carry, masked):
            m, l, acc = carry
            s, mask = scores(qb, k_b[j], i, j, masked)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            if masked:
                p = jnp.where(mask, p, 0.0)
            alpha = jnp.exp(m - m_new)
            l = alpha * l + jnp.sum(p, axis=-1)
            pv = jnp.einsum("BKGTS,BKSH->BKGTH", p.astype(v.dtype), v_b[j],
                            preferred_element_type=jnp.float32)
            return m_new, l, alpha[..., None] * acc + pv

        rows = qb.shape[:-1]
        init = (jnp.full(rows, MASK_VALUE, jnp.float32), jnp.zeros(rows, jnp.float32),
                jnp.zeros(qb.shape, jnp.float32))
        m, l, acc = loop_over_ranges(*scores.ranges(i), body, init)
        seen = l > 0
        out = acc / jnp.where(seen, l, 1.0)[..., None]
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)
        return None, (out.astype(q.dtype), lse)

    _, (out, lse) = lax.scan(q_block, None, (geo.q_blocks(q), jnp.arange(geo.nq)))
    return geo.q_unblocks(out), geo.row_unblocks(lse)


def _backward(st: _Static, res, d_out):
    q, k, v, q_seg, kv_seg, slopes, offset, out, lse = res
    B, T, N, H = q.shape
    K = k.shape[2]
    geo = _Blocks.make(st, st.bwd_block_q, st.bwd_block_k).with_heads(K, N // K)
    scores = _Scores(geo, offset, geo.seg_blocks(q_seg, T, geo.bq, geo.nq),
                     geo.seg_blocks(kv_seg, st.kv_len, geo.bk, geo.nk), slopes)
    delta = jnp.einsum("BTNH,BTNH->BTN", d_out.astype(jnp.float32), out.astype(jnp.float32))
    k_b, v_b = geo.kv_blocks(k), geo.kv_blocks(v)
    dt = q.dtype

    def q_block(dkv, xs):
        qb, dob, lseb, deltab, i = xs

        def body(j, carry, masked):
            dq, dk, dv = carry
            kb, vb = k_b[j], v_b[j]
            s, mask = scores(qb, kb, i, j, masked)
            p = jnp.exp(s - lseb[..., None])
            if masked:
                p = jnp.where(mask, p, 0.0)
            dp = jnp.einsum("BKGTH,BKSH->BKGTS", dob, vb, preferred_element_type=jnp.float32)
            ds = (p * (dp - deltab[..., None])).astype(dt)
            dv = dv.at[j].add(jnp.einsum("BKGTS,BKGTH->BKSH", p.astype(dt), dob,
                                         preferred_element_type=jnp.float32))
            dk = dk.at[j].add(jnp.einsum("BKGTS,BKGTH->BKSH", ds, qb,
                                         preferred_element_type=jnp.float32))
            dq = dq + jnp.einsum("BKGTS,BKSH->BKGTH", ds, kb, preferred_element_type=jnp.float32)
            return dq, dk, dv

        dq, dk, dv = loop_over_ranges(*scores.ranges(i), body,
                                      (jnp.zeros(qb.shape, jnp.float32), *dkv))
        return (dk, dv), dq

    zeros_kv = jnp.zeros(k_b.shape, jnp.float32)
    xs = (geo.q_blocks(q), geo.q_blocks(d_out.astype(dt)), geo.row_blocks(lse),
          geo.row_blocks(delta), jnp.arange(geo.nq))
    (dk, dv), dq = lax.scan(q_block, (zeros_kv, zeros_kv), xs)
    dq = (geo.q_unblocks(dq) * st.scale).astype(q.dtype)
    dk = (geo.kv_unblocks(dk) * st.scale).astype(k.dtype)
    dv = geo.kv_unblocks(dv).astype(v.dtype)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, q_seg, kv_seg, slopes, offset):
    return _forward(st, q, k, v, q_seg, kv_seg, slopes, offset)[0]


def _attention_fwd(st, q, k, v, q_seg, kv_seg, slopes, offset):
    out, lse = _forward(st, q, k, v, q_seg, kv_seg, slopes, offset)
    return out, (q, k, v, q_seg, kv_seg, slopes, offset, out, lse)


def _attention_bwd(st, res, d_out):
    dq, dk, dv = _backward(st, res, d_out)
    q_seg, kv_seg, slopes, offset = res[3:7]
    zero = lambda x: None if x is None else jnp.zeros_like(x)  # noqa: E731  constants
    return dq, dk, dv, None, None, zero(slopes), None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, *, causal, q_segment_ids, kv_segment_ids, window, alibi_slopes,
              bias, q_offset, scale, block_sizes: BlockSizes | None = None):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]``; see the module docstring.

    ``q_offset`` may be a traced int32 scalar (decoding); block skipping still applies.
    """
    if bias is not None:
        raise ValueError("impl='blockwise' takes structured masks only; a dense bias needs "
                         "impl='xla' or 'reference'")
    bs = block_sizes or BlockSizes()
    bwd = bs.backward()
    st = _Static(causal=bool(causal), window=None if window is None else int(window),
                 scale=float(scale), q_len=q.shape[1], kv_len=k.shape[1],
                 block_q=bs.block_q, block_k=bs.block_k,
                 bwd_block_q=bwd.block_q, bwd_block_k=bwd.block_k)
    if q_segment_ids is not None:
        q_segment_ids = q_segment_ids.astype(jnp.int32)
        kv_segment_ids = kv_segment_ids.astype(jnp.int32)
    offset = jnp.asarray(q_offset, jnp.int32)
    return _attention(st, q, k, v, q_segment_ids, kv_segment_ids, alibi_slopes, offset)
