"""Structured attention masks and ALiBi biases, shared by every attention path.

A query at absolute position ``p = q_offset + t`` may attend to key ``s`` when
  * ``causal`` is off, or ``s <= p``;
  * ``window`` is None, or ``|p - s| <= window`` (``window`` past positions, and
    as many future ones when not causal);
  * segment ids are None, or ``q_segment_ids[t] == kv_segment_ids[s] != 0``
    (segment 0 is padding and never attends nor is attended to).
"""

from __future__ import annotations

import jax.numpy as jnp


def allowed(q_pos, kv_pos, *, causal, window, q_seg=None, kv_seg=None):
    """Boolean mask from broadcastable position and segment arrays.

    ``q_pos`` and ``q_seg`` broadcast along the query axis (``[..., T, 1]``),
    ``kv_pos`` and ``kv_seg`` along the key axis (``[..., 1, S]``).
    """
    ok = jnp.ones(jnp.broadcast_shapes(jnp.shape(q_pos), jnp.shape(kv_pos)), bool)
    if q_seg is not None:
        ok = ok & (q_seg == kv_seg) & (q_seg != 0)
    if causal:
        ok = ok & (kv_pos <= q_pos)
    if window is not None:
        ok = ok & (jnp.abs(q_pos - kv_pos) <= window)
    return ok


def dense_mask(T, S, *, causal, window=None, q_segment_ids=None, kv_segment_ids=None, q_offset=0):
    """The full mask ``[B|1, 1, T, S]`` (bool, True = attend)."""
    q_pos = (jnp.arange(T) + q_offset).reshape(1, 1, T, 1)
    kv_pos = jnp.arange(S).reshape(1, 1, 1, S)
    q_seg = kv_seg = None
    if q_segment_ids is not None:
        q_seg = q_segment_ids[:, None, :, None]
        kv_seg = kv_segment_ids[:, None, None, :]
    return allowed(q_pos, kv_pos, causal=causal, window=window, q_seg=q_seg, kv_seg=kv_seg)


def alibi_slopes(num_heads: int):
    """ALiBi slopes ``m_h = 2^(-8h/N)`` for h = 1..N (Press et al. 2022). Shape ``[N]``."""
    h = jnp.arange(1, num_heads + 1, dtype=jnp.float32)
    return 2.0 ** (-8.0 * h / num_heads)


def alibi_bias(slopes, q_pos, kv_pos):
    """ALiBi bias ``-m_n |p - s|`` with ``slopes [N]``: returns ``[N, T, S]`` (float32)."""
    distance = jnp.abs(q_pos[:, None] - kv_pos[None, :]).astype(jnp.float32)
    return -slopes.astype(jnp.float32)[:, None, None] * distance[None]
