"""LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019), computed in float32.

Hooks, as TransformerLens names them: ``hook_scale [..., 1]``, the denominator ``sqrt(var +
eps)`` (RMSNorm: ``sqrt(mean(x^2) + eps)``; frozen from a cache, it makes the norm linear, as
direct logit attribution needs), and ``hook_normalized [..., D]``, the normalised input before
the weight and bias. The norm multiplies by the denominator's reciprocal, with or without hooks.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tfmjax.layers.axes import EMBED, named
from tfmjax.layers.hooks import hook


def _expand(vector, like):
    """``[D]`` -> ``[1, ..., 1, D]`` to broadcast explicitly against ``like``."""
    return vector.reshape((1,) * (like.ndim - 1) + vector.shape)


class LayerNorm(nn.Module):
    """``gamma * (x - mean) / sqrt(var + eps) + beta`` over the last axis ``D``."""

    eps: float
    axis_name: str | None = EMBED  # logical name of the normalised axis (for sharding)

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", named(nn.initializers.ones, self.axis_name), (x.shape[-1],))
        bias = self.param("bias", named(nn.initializers.zeros, self.axis_name), (x.shape[-1],))
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        denominator = hook(self, "hook_scale", jnp.sqrt(var + self.eps))
        y = hook(self, "hook_normalized", (xf - mean) * jnp.reciprocal(denominator))
        return (y * _expand(scale, y) + _expand(bias, y)).astype(x.dtype)


class RMSNorm(nn.Module):
    """``gamma * x / sqrt(mean(x^2) + eps)`` over the last axis ``D`` (no centring, no shift)."""

    eps: float
    axis_name: str | None = EMBED  # logical name of the normalised axis (for sharding)

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", named(nn.initializers.ones, self.axis_name), (x.shape[-1],))
        xf = x.astype(jnp.float32)
        mean_square = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
        denominator = hook(self, "hook_scale", jnp.sqrt(mean_square + self.eps))
        y = hook(self, "hook_normalized", xf * jnp.reciprocal(denominator))
        return (y * _expand(scale, y)).astype(x.dtype)


def make_norm(kind: str, eps: float, name: str | None = None) -> nn.Module:
    """``"layernorm"`` or ``"rmsnorm"``."""
    if kind == "layernorm":
        return LayerNorm(eps=eps, name=name)
    if kind == "rmsnorm":
        return RMSNorm(eps=eps, name=name)
    raise ValueError(f"norm={kind!r} is not one of layernorm, rmsnorm")
