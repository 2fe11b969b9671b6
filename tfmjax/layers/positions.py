"""Positional encodings: sinusoidal (Vaswani 2017), learned, RoPE (Su 2021), ALiBi (Press 2022),
T5 relative bias (Raffel 2020)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels.masks import alibi_slopes  # noqa: F401  (re-exported: one definition)
from tfmjax.layers.axes import EMBED, HEADS, named


def sinusoidal(positions, d_model: int, base: float = 10000.0, layout: str = "interleaved"):
    """``PE[pos, 2i] = sin(pos w_i)``, ``PE[pos, 2i+1] = cos(pos w_i)``, ``w_i = base^(-2i/D)``
    (Vaswani et al. 2017); ``layout="half_split"``: all sines, then all cosines (Marian).

    ``positions [..., T]`` (int) -> ``[..., T, D]`` float32.
    """
    i = jnp.arange(d_model // 2, dtype=jnp.float32)
    omega = base ** (-2.0 * i / d_model)
    angles = positions[..., None].astype(jnp.float32) * omega.reshape((1,) * positions.ndim + (-1,))
    if layout == "half_split":
        pe = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    elif layout == "interleaved":
        pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., T, D/2, 2]
        pe = pe.reshape(*angles.shape[:-1], 2 * (d_model // 2))
    else:
        raise ValueError(f"sinusoidal layout={layout!r} is not one of interleaved, half_split")
    if d_model % 2:
        pe = jnp.concatenate([pe, jnp.zeros((*pe.shape[:-1], 1), pe.dtype)], axis=-1)
    return pe


class LearnedPositions(nn.Module):
    """``W_pos[positions]`` from a ``[max_len, D]`` table (GPT-2, BERT)."""

    max_len: int
    d_model: int

    @nn.compact
    def __call__(self, positions):
        init = named(nn.initializers.normal(0.02), None, EMBED)
        table = self.param("pos_embedding", init, (self.max_len, self.d_model))
        return jnp.take(table, positions, axis=0)


def apply_rope(x, positions, base: float = 10000.0, layout: str = "interleaved"):
    """Rotate feature pairs of ``x`` by ``pos * base^(-2i/H)`` (RoPE, Su et al. 2021).

    ``layout="interleaved"``: pair ``i`` is ``(x[2i], x[2i+1])``; ``"half_split"``: pair ``i`` is
    ``(x[i], x[i + H/2])`` (``rotate_half``, the Hugging Face layout).
    ``x [B,T,N,H]``, ``positions [B,T]`` -> ``[B,T,N,H]`` in x's dtype.
    """
    H = x.shape[-1]
    theta = base ** (-2.0 * jnp.arange(H // 2, dtype=jnp.float32) / H)  # [H/2]
    angles = (
        positions.astype(jnp.float32)[:, :, None, None] * theta[None, None, None]
    )  # [B,T,1,H/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    xf = x.astype(jnp.float32)
    if layout == "half_split":
        x0, x1 = xf[..., : H // 2], xf[..., H // 2 :]
        return jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).astype(x.dtype)
    if layout != "interleaved":
        raise ValueError(f"rope layout={layout!r} is not one of interleaved, half_split")
    pairs = xf.reshape(*x.shape[:-1], H // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return rotated.reshape(x.shape).astype(x.dtype)


def relative_bucket(relative_position, *, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucketing of ``key_pos - query_pos``: exact for small offsets, log-spaced after."""
    n = -relative_position
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets = (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / np.log(
        max_distance / max_exact
    )
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    """T5-style learned scalar bias per head and bucket: returns ``[1, N, T, S]``."""

    num_heads: int
    num_buckets: int  # T5: 32
    max_distance: int  # T5: 128
    bidirectional: bool  # True in an encoder, False in a decoder

    @nn.compact
    def __call__(self, q_pos, kv_pos):
        """``q_pos [T]``, ``kv_pos [S]`` (absolute positions)."""
        init = named(nn.initializers.normal(0.02), None, HEADS)
        table = self.param("rel_bias", init, (self.num_buckets, self.num_heads))
        buckets = relative_bucket(
            kv_pos[None, :] - q_pos[:, None],
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        return jnp.transpose(table[buckets], (2, 0, 1))[None]
