"""Fused-einsum attention for short sequences.

Same semantics as :mod:`tfmjax.kernels.reference`, but GQA is a grouped einsum
(K/V never repeated), matmuls run in the input dtype with float32 accumulation,
and masking uses a finite minimum so XLA can fuse mask, softmax and scaling.

XLA:CPU has no batched bf16 x bf16 -> f32 dot ("Unsupported element type for
DotThunk::Execute"; e.g. a bf16 model decoding at batch > 1): lowered for the CPU, the two
matmuls take their operands upcast to float32 instead, the same products (two bf16 multiply
exactly in float32) and the same float32 accumulation; other platforms keep the input-dtype
matmuls (:func:`einsum_f32`, chosen by ``jax.lax.platform_dependent`` when lowering).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfmjax.kernels.masks import alibi_bias, dense_mask


def einsum_f32(spec: str, a, b):
    """``jnp.einsum(spec, a, b)`` accumulated in float32; on the CPU, float32 operands."""

    def dot(a, b):
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)

    if a.dtype == jnp.float32 and b.dtype == jnp.float32:
        return dot(a, b)
    upcast = lambda a, b: dot(a.astype(jnp.float32), b.astype(jnp.float32))  # noqa: E731
    return jax.lax.platform_dependent(a, b, cpu=upcast, default=dot)


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
    scores = einsum_f32("BTKGH,BSKH->BKGTS", qg, k) * scale
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
    out = einsum_f32("BKGTS,BSKH->BTKGH", probs.astype(v.dtype), v)
    return out.reshape(B, T, N, H).astype(q.dtype)
