"""Reference attention: ``softmax(Q K^T / sqrt(H) + mask) V`` (Vaswani et al. 2017), literally.

Materialise the scores, set blocked positions to -inf, softmax, weighted sum.
K/V heads are repeated to the N query heads (obviously correct, memory-hungry).
Rows with nothing to attend to return zeros. Everything is computed in float32.
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
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]`` in q's dtype. The mask options
    (``causal``, ``window``, ``stride``, ``global_tokens``, ``random_blocks``, segment ids)
    are those of :mod:`tfmjax.kernels.masks`."""
    probs = probabilities(
        q,
        k,
        causal=causal,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        window=window,
        alibi_slopes=alibi_slopes,
        bias=bias,
        q_offset=q_offset,
        scale=scale,
        stride=stride,
        global_tokens=global_tokens,
        random_blocks=random_blocks,
    )
    return weighted_values(probs, v).astype(q.dtype)


def probabilities(q, k, **mask):
    """The attention pattern ``softmax(Q K^T * scale + bias, masked)``: ``[B,N,T,S]`` float32
    (rows with nothing to attend to are all zero). ``mask``: the keywords of :func:`scores`."""
    return softmax_rows(scores(q, k, **mask))


def scores(
    q,
    k,
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
    """The attention logits ``Q K^T * scale + bias`` with blocked entries at -inf:
    ``[B,N,T,S]`` float32 (K/V heads repeated to the N query heads)."""
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    kf = jnp.repeat(kf, N // K, axis=2)  # [B,S,N,H]
    logits = jnp.einsum("BTNH,BSNH->BNTS", qf, kf) * scale
    if alibi_slopes is not None:
        logits = logits + alibi_bias(alibi_slopes, jnp.arange(T) + q_offset, jnp.arange(S))[None]
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
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
    )
    return jnp.where(mask, logits, -jnp.inf)


def softmax_rows(scores):
    """Softmax over the last axis of masked ``scores [..., S]`` (-inf: blocked); a row with
    nothing to attend to is all zero."""
    # The shift cancels in the softmax, so no gradient flows through it (as in jax.nn.softmax):
    # max's own gradient splits among the entries equal to the max, and when XLA computes the
    # scores twice (unoptimized builds do) with a rounding apart, it found none and gave inf.
    row_max = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)  # empty rows: avoid inf - inf
    weights = jnp.exp(scores - row_max)
    denom = jnp.sum(weights, axis=-1, keepdims=True)
    return weights / jnp.where(denom > 0, denom, 1.0)  # empty rows stay all-zero


def weighted_values(probs, v):
    """``probs [B,N,T,S]``, ``v [B,S,K,H]`` -> ``[B,T,N,H]`` float32 (K/V heads repeated)."""
    N, K = probs.shape[1], v.shape[2]
    vf = jnp.repeat(v.astype(jnp.float32), N // K, axis=2)  # [B,S,N,H]
    return jnp.einsum("BNTS,BSNH->BTNH", probs, vf)
