"""Structured attention masks and ALiBi biases, shared by every attention path.

A query at absolute position ``p = q_offset + t`` may attend to key slot ``s`` (distance
``d = p - s``) when all of these hold:

  * **segments**: segment ids are None, or ``q_segment_ids[t] == kv_segment_ids[s] != 0``
    (segment 0 is padding and never attends nor is attended to);
  * **causal**: ``causal`` is off, or ``s <= p``;
  * **pattern**: ``pattern_ok OR p < global_tokens OR s < global_tokens``, where
    ``pattern_ok`` is the window/stride predicate:

    - neither ``window`` nor ``stride``: True (full attention);
    - ``window`` alone: ``|d| <= window`` (``window`` past positions, and as many future
      ones when not causal: a sliding window);
    - ``stride`` (the Sparse Transformer's strided pattern, Child et al. 2019: the "local +
      strided" union in one head): ``|d| < stride`` (local part) OR ``d % stride == 0``
      (strided part; floor modulo, so it also holds for negative ``d`` when not causal).
      With ``window`` too, the local part is ``|d| <= window`` instead of ``|d| < stride``.

    ``global_tokens = g`` (Longformer's global attention, Beltagy et al. 2020): the first
    ``g`` positions (queries with ``p < g``, keys with ``s < g``) attend to every key and
    are attended by every query, overriding the window/stride pattern but not the causal
    and segment rules. Without a window or stride there is nothing to override.

``window``, ``stride`` and ``global_tokens`` are static Python ints; :func:`allowed` is the
one implementation of the rule, used per element, per block and for the dense mask.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def has_pattern(window, stride) -> bool:
    """Whether a window or stride restricts attention (else global tokens change nothing)."""
    return window is not None or stride is not None


def pattern_ok(q_pos, kv_pos, *, window, stride):
    """The window/stride predicate on broadcastable positions, or None when it is always
    True (no window and no stride). See the module docstring."""
    if not has_pattern(window, stride):
        return None
    d = q_pos - kv_pos
    local = jnp.abs(d) <= (stride - 1 if window is None else window)
    if stride is None:
        return local
    # Divisibility is the same under floor and truncated remainder; lax.rem lowers on every
    # Pallas backend (jnp.remainder adds sign fix-ups).
    return local | (lax.rem(d, jnp.asarray(stride, d.dtype)) == 0)


def allowed(
    q_pos,
    kv_pos,
    *,
    causal,
    window,
    stride=None,
    global_tokens=0,
    q_seg=None,
    kv_seg=None,
):
    """Boolean mask from broadcastable position and segment arrays (see the module docstring).

    ``q_pos`` and ``q_seg`` broadcast along the query axis (``[..., T, 1]``),
    ``kv_pos`` and ``kv_seg`` along the key axis (``[..., 1, S]``).
    """
    ok = jnp.ones(jnp.broadcast_shapes(jnp.shape(q_pos), jnp.shape(kv_pos)), bool)
    if q_seg is not None:
        ok = ok & (q_seg == kv_seg) & (q_seg != 0)
    if causal:
        ok = ok & (kv_pos <= q_pos)
    pattern = pattern_ok(q_pos, kv_pos, window=window, stride=stride)
    if pattern is not None:
        if global_tokens:
            pattern = pattern | (q_pos < global_tokens) | (kv_pos < global_tokens)
        ok = ok & pattern
    return ok


def dense_mask(
    T,
    S,
    *,
    causal,
    window=None,
    stride=None,
    global_tokens=0,
    q_segment_ids=None,
    kv_segment_ids=None,
    q_offset=0,
):
    """The full mask ``[B|1, 1, T, S]`` (bool, True = attend)."""
    q_pos = (jnp.arange(T) + q_offset).reshape(1, 1, T, 1)
    kv_pos = jnp.arange(S).reshape(1, 1, 1, S)
    q_seg = kv_seg = None
    if q_segment_ids is not None:
        q_seg = q_segment_ids[:, None, :, None]
        kv_seg = kv_segment_ids[:, None, None, :]
    return allowed(
        q_pos,
        kv_pos,
        causal=causal,
        window=window,
        stride=stride,
        global_tokens=global_tokens,
        q_seg=q_seg,
        kv_seg=kv_seg,
    )


def alibi_slopes(num_heads: int):
    """ALiBi slopes ``m_h = 2^(-8h/N)`` for h = 1..N (Press et al. 2022). Shape ``[N]``."""
    h = jnp.arange(1, num_heads + 1, dtype=jnp.float32)
    return 2.0 ** (-8.0 * h / num_heads)


def alibi_bias(slopes, q_pos, kv_pos):
    """ALiBi bias ``-m_n |p - s|`` with ``slopes [N]``: returns ``[N, T, S]`` (float32)."""
    distance = jnp.abs(q_pos[:, None] - kv_pos[None, :]).astype(jnp.float32)
    return -slopes.astype(jnp.float32)[:, None, None] * distance[None]
