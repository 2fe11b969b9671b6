"""Fused-einsum attention for short sequences.

Same semantics as :mod:`tfmjax.kernels.reference`, but GQA is a grouped einsum
(K/V never repeated), matmuls run in the input dtype with float32 accumulation,
and masking uses a finite minimum so XLA can fuse mask, softmax and scaling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfmjax.kernels.masks import alibi_bias, dense_mask


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
    stride=None,
    global_tokens=0,
    random_blocks=None,
):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]``. The mask options (``causal``,
    ``window``, ``stride``, ``global_tokens``, ``random_blocks``, segment ids) are those of
    :mod:`tfmjax.kernels.masks`."""
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    qg = q.reshape(B, T, K, G, H)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32) * scale
    if alibi_slopes is not None:
        alibi = alibi_bias(alibi_slopes, jnp.arange(T) + q_offset, jnp.arange(S))
        scores = scores + alibi.reshape(1, K, G, T, S)
    if bias is not None:
        bias = jnp.broadcast_to(bias, (bias.shape[0], N, T, S)).astype(jnp.float32)
        scores = scores + bias.reshape(bias.shape[0], K, G, T, S)
    mask = dense_mask(
        T,
        S,
        causal=causal,
        window=window,
        stride=stride,
        global_tokens=global_tokens,
        random_blocks=random_blocks,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        q_offset=q_offset,
    )[:, :, None]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(jnp.any(mask, axis=-1, keepdims=True), probs, 0.0)
    out = jnp.einsum(
        "BKGTS,BSKH->BTKGH", probs.astype(v.dtype), v, preferred_element_type=jnp.float32
    )
    return out.reshape(B, T, N, H).astype(q.dtype)
