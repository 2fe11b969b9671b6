"""The forward pass of the blockwise kernel (:mod:`tfmjax.kernels.blockwise`): for each query
block, the online softmax over the key blocks it needs (running row maximum ``m``, running
denominator ``l``, unnormalised output ``O``). Returns ``O`` and the row log-sum-exp
``lse = m + log l``, the only residual the backward needs.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from tfmjax.kernels.block_geometry import ROW_MAX_INIT, loop_over_ranges
from tfmjax.kernels.blockwise_layout import (
    BlockScores,
    BlockwiseStatic,
    PassGeometry,
    group_inputs,
)


def forward_group(geo: PassGeometry, prescaled: bool, offset, q_b, k_b, v_b, q_seg, kv_seg, slopes):
    """One group: ``q_b [nq,G,bq,H]``, ``k_b [nk,H,bk]``, ``v_b [nk,bk,H]`` -> out, lse
    ``[nq,G,bq(,H)]``. (K is stored transposed: the QK^T matmul's natural layout.)"""
    scores = BlockScores(geo, offset, q_seg, kv_seg, slopes, prescaled, k_transposed=True)

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


def forward(st: BlockwiseStatic, q, k, v, q_seg, kv_seg, slopes, offset):
    """``out [B,T,N,H]`` (q's dtype) and ``lse [B,T,N]`` (float32, +inf for empty rows)."""
    geo, prescaled, groups = group_inputs(
        st, st.blocks.block_q, st.blocks.block_k, q, k, v, q_seg, kv_seg, slopes
    )
    groups = (groups[0], jnp.swapaxes(groups[1], -1, -2)) + groups[2:]  # K as [H, bk]
    fn = functools.partial(forward_group, geo, prescaled, offset)
    out, lse = lax.map(lambda xs: fn(*xs), groups, batch_size=st.blocks.kv_heads_per_step)
    return geo.ungroup_q(out), geo.ungroup_q(lse)
