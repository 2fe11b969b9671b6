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

    ``random_blocks`` (BigBird's random attention, Zaheer et al. 2020; a :class:`RandomBlocks`
    or None): positions fall in blocks of ``size``; query block ``i = p // size`` also sees
    the ``count`` key blocks :func:`random_key_block` draws for it, fixed by ``seed``. With a
    window and global tokens this is BigBird's window + global + random pattern.

``window``, ``stride`` and ``global_tokens`` are static Python ints, ``random_blocks`` a
static (hashable) value; :func:`allowed` is the one implementation of the rule, used per
element, per block and for the dense mask.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass(frozen=True)
class RandomBlocks:
    """BigBird's random blocks: each query block of ``size`` positions sees ``count`` key
    blocks drawn (with replacement: at most ``count`` distinct ones) by a fixed integer hash of
    ``(seed, query block, draw)``. Causal: from the blocks before its own (none for block 0);
    not causal: from the ``num_blocks`` blocks of the longest sequence (``ceil(max_len /
    size)``) except its own. The same for every layer and head."""

    count: int
    size: int
    seed: int = 0
    num_blocks: int = 0  # the draw's range when not causal

    def __post_init__(self):
        for name in ("count", "size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"RandomBlocks.{name}={value!r} must be an int >= 1")
        if not (isinstance(self.num_blocks, int) and self.num_blocks >= 0):
            raise ValueError(f"RandomBlocks.num_blocks={self.num_blocks!r} must be an int >= 0")


def _as_int32(x: int):
    """A 32-bit constant as int32 (two's complement), so products wrap like uint32's."""
    return jnp.int32(x - (1 << 32) if x >= 1 << 31 else x)


def _mix(x):
    """A 32-bit integer hash (lowbias32: xor-shift-multiply) on int32 arrays or scalars."""
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = x ^ lax.shift_right_logical(x, jnp.int32(shift))
        x = x * _as_int32(factor)
    return x ^ lax.shift_right_logical(x, jnp.int32(16))


def random_key_block(rb: RandomBlocks, q_block, draw: int, *, causal: bool):
    """The key block of draw ``draw`` (``0 <= draw < rb.count``) for query block(s)
    ``q_block`` (int32, any shape): int32 of the same shape, -1 where there is none."""
    q_block = jnp.asarray(q_block, jnp.int32)
    x = _mix(q_block * _as_int32(0x9E3779B1) + jnp.int32((rb.seed * 7919 + draw) % (1 << 31)))
    x = _mix(x ^ jnp.int32(draw * 0x27D4EB2F % (1 << 31)))
    x = x & jnp.int32(0x7FFFFFFF)  # non-negative
    if causal:  # one of the blocks 0 .. q_block - 1
        choices = q_block
        target = lax.rem(x, jnp.maximum(choices, 1))
    else:  # one of the other num_blocks - 1 blocks
        choices = jnp.full_like(q_block, rb.num_blocks - 1)
        target = lax.rem(x, jnp.maximum(choices, 1))
        target = target + (target >= q_block).astype(jnp.int32)
    return jnp.where(choices >= 1, target, -1)


def _block_of(rb: RandomBlocks, pos):
    """``pos // size`` for non-negative int32 positions (``lax.div`` lowers on every Pallas
    backend; it truncates, which is the floor here)."""
    return lax.div(jnp.asarray(pos, jnp.int32), jnp.int32(rb.size))


def random_ok(rb: RandomBlocks, q_pos, kv_pos, *, causal: bool):
    """Whether key position(s) ``kv_pos`` fall in a random block of query position(s)
    ``q_pos`` (broadcastable int32 arrays)."""
    q_block, kv_block = _block_of(rb, q_pos), _block_of(rb, kv_pos)
    ok = None
    for draw in range(rb.count):
        hit = random_key_block(rb, q_block, draw, causal=causal) == kv_block
        ok = hit if ok is None else ok | hit
    return ok


def random_blocks_meet(rb: RandomBlocks, p_lo, p_hi, s_lo, s_hi, *, causal: bool):
    """Whether some query position in ``p_lo..p_hi`` has a random key block meeting key
    positions ``s_lo..s_hi`` (traced int32 scalars): scalar work only, for the kernels'
    decision to visit a block outside the band."""
    k_lo, k_hi = _block_of(rb, s_lo), _block_of(rb, s_hi)

    def query_block(i, met):
        for draw in range(rb.count):
            target = random_key_block(rb, i, draw, causal=causal)
            met = met | ((target >= k_lo) & (target <= k_hi))
        return met

    first, last = _block_of(rb, p_lo), _block_of(rb, p_hi)
    return lax.fori_loop(first, last + 1, query_block, jnp.bool_(False))


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
    random_blocks=None,
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
        if random_blocks is not None:
            pattern = pattern | random_ok(random_blocks, q_pos, kv_pos, causal=causal)
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
    random_blocks=None,
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
        random_blocks=random_blocks,
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
