"""The backward pass of the blockwise kernel (:mod:`tfmjax.kernels.blockwise`), FlashAttention-2
style: ``P = exp(S - lse)`` is recomputed block by block from the saved log-sum-exp, in one
pass: outer loop over query blocks carrying ``dK, dV`` for the whole key length, inner loop
over the needed key blocks carrying the block's ``dQ``. Five matmuls per block pair.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from tfmjax.kernels.block_geometry import loop_over_ranges
from tfmjax.kernels.blockwise_layout import (
    BlockScores,
    BlockwiseStatic,
    PassGeometry,
    group_inputs,
)


def backward_group(
    geo: PassGeometry,
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
    scores = BlockScores(geo, offset, q_seg, kv_seg, slopes, prescaled)
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


def backward(st: BlockwiseStatic, res, d_out):
    """``dq, dk, dv`` (the dtypes of q, k, v) from ``d_out [B,T,N,H]`` and the forward's
    residuals ``res``: q, k, v, segment ids, slopes, offset, ``out [B,T,N,H]``, ``lse
    [B,T,N]``."""
    q, k, v, q_seg, kv_seg, slopes, offset, out, lse = res
    bwd = st.blocks.backward()
    geo, prescaled, groups = group_inputs(
        st, bwd.block_q, bwd.block_k, q, k, v, q_seg, kv_seg, slopes
    )
    delta = jnp.einsum("BTNH,BTNH->BTN", d_out.astype(jnp.float32), out.astype(jnp.float32))
    extra = (geo.group_q(d_out.astype(q.dtype)), geo.group_q(lse), geo.group_q(delta))
    fn = functools.partial(backward_group, geo, prescaled, offset)
    dq, dk, dv = lax.map(lambda xs: fn(*xs), groups + extra, batch_size=st.blocks.kv_heads_per_step)
    dq = (geo.ungroup_q(dq) * st.scale).astype(q.dtype)
    dk = geo.ungroup_kv(dk)  # = dS^T (scale * q) when q was pre-scaled
    dk = (dk if prescaled else dk * st.scale).astype(k.dtype)
    return dq, dk, geo.ungroup_kv(dv).astype(v.dtype)
