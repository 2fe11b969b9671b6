"""The data layout of the blockwise kernel (:mod:`tfmjax.kernels.blockwise`): block sizes,
the static options of a call, the regrouping of the public layouts, and one block's scores.

The public layouts are regrouped once so that the loops run over one (batch, key/value head)
group at a time: q ``[B*K, nq, G, bq, H]`` and k, v ``[B*K, nk, bk, H]``. A group's score
block ``[G, bq, bk]`` then stays in cache between the passes XLA makes over it (max, exp,
sum, matmul). The ``G = N / K`` query heads of a group share its matmuls (``GTH,SH->GTS``):
K and V are never repeated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from tfmjax.kernels.block_geometry import (
    MASK_VALUE,
    BlockRanges,
    block_mask,
    pattern_options,
    pattern_ranges,
)
from tfmjax.kernels.masks import alibi_bias


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


@dataclasses.dataclass(frozen=True)
class BlockwiseStatic:
    """Everything static about one call (hashable: the custom_vjp's nondiff argument)."""

    causal: bool
    window: int | None
    scale: float
    q_len: int
    kv_len: int
    blocks: BlockSizes
    stride: int | None = None
    global_tokens: int = 0
    random_blocks: Any = None  # masks.RandomBlocks


@dataclasses.dataclass(frozen=True)
class PassGeometry:
    """Block sizes and counts of one pass, and the regrouping of the public layouts."""

    bq: int
    bk: int
    nq: int
    nk: int
    K: int
    G: int
    st: BlockwiseStatic

    @classmethod
    def make(cls, st: BlockwiseStatic, bq: int, bk: int, K: int, G: int) -> PassGeometry:
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
        """``[B*K, nk, bk, H]`` -> ``[B,S,K,H]`` (inverse of :meth:`group_kv`)."""
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


class BlockScores:
    """Scores of one (query block i, key block j) pair of one group: ``[G, bq, bk]`` f32."""

    def __init__(
        self,
        geo: PassGeometry,
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
            s = s + alibi_bias(self.slopes, q_pos, kv_pos)  # [G, bq, bk]
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


def group_inputs(st: BlockwiseStatic, bq: int, bk: int, q, k, v, q_seg, kv_seg, slopes):
    """The pass's :class:`PassGeometry`, whether q is pre-scaled, and the per-group arguments:
    q ``[B*K,nq,G,bq,H]`` (scaled when float32), k, v ``[B*K,nk,bk,H]``, segment ids
    ``[B*K,nq,bq]``, ``[B*K,nk,bk]`` and slopes ``[B*K,G]`` (None when absent)."""
    B, N, K = q.shape[0], q.shape[2], k.shape[2]
    geo = PassGeometry.make(st, bq, bk, K, N // K)
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
