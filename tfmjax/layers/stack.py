"""A stack of ``L`` identical blocks, scanned (``nn.scan``) or unrolled, with optional remat.

Blocks have the signature ``block(x, cache, inputs) -> (x, cache)``. A stack's cache is
either stacked (leaves with a leading ``[L]`` axis) or a tuple of ``L`` per-layer caches,
returned in the same form; unrolled stacks update per-layer caches without copying the
other layers' (what decoding uses). Scanned parameters carry a leading ``[L]`` axis under
``layers``; unrolled ones live in ``layer_0 .. layer_{L-1}``.
:func:`unstack_params` and :func:`stack_params` convert between the two layouts.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.layers.axes import LAYERS

# A scanned stack of at most this many layers runs its loop unrolled (``nn.scan(unroll=L)``):
# the same stacked parameters and the same math, without the loop's per-step slicing and the
# zero-filled buffers its backward pass stacks residuals in (1.18x a step on the
# shakespeare_char shape on XLA:CPU, docs/cpu_speed.md). Deeper stacks keep the loop, so
# compile time stays one layer's.
UNROLL_MAX_LAYERS = 6


class LayerStack(nn.Module):
    """``x [B,T,D]``, per-layer ``cache`` (leading axis ``L``, or None) -> ``(x, cache)``."""

    block: Any  # a block class, e.g. SelfAttentionBlock
    block_kwargs: dict  # keyword arguments of the block (its config)
    num_layers: int
    scan: bool = True
    remat: bool = False

    @nn.compact
    def __call__(self, x, cache, inputs):
        block = nn.remat(self.block, prevent_cse=not self.scan) if self.remat else self.block
        per_layer = isinstance(cache, tuple)  # one cache per layer: updated in place (decoding)
        if self.scan:
            scanned = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(0, nn.broadcast),
                length=self.num_layers,
                unroll=self.num_layers if self.num_layers <= UNROLL_MAX_LAYERS else 1,
                metadata_params={nn.PARTITION_NAME: LAYERS},
            )
            stacked = jax.tree.map(lambda *cs: jnp.stack(cs), *cache) if per_layer else cache
            x, stacked = scanned(**self.block_kwargs, name="layers")(x, stacked, inputs)
            if per_layer:
                return x, tuple(layer_cache(stacked, i) for i in range(self.num_layers))
            return x, stacked
        new_cache = []
        for i in range(self.num_layers):
            layer = None if cache is None else cache[i] if per_layer else layer_cache(cache, i)
            x, layer = block(**self.block_kwargs, name=f"layer_{i}")(x, layer, inputs)
            new_cache.append(layer)
        if cache is None or per_layer:
            return x, None if cache is None else tuple(new_cache)
        return x, jax.tree.map(lambda *cs: jnp.stack(cs), *new_cache)


def layer_cache(cache, i: int):
    """Layer ``i``'s cache from a stacked cache (leading axis ``L``) or a tuple of caches."""
    return cache[i] if isinstance(cache, tuple) else jax.tree.map(lambda c: c[i], cache)


def unstack_params(stack_params: dict, num_layers: int) -> dict:
    """``{"layers": leaves [L, ...]}`` -> ``{"layer_i": leaves [...]}``."""
    return {
        f"layer_{i}": jax.tree.map(lambda p, i=i: p[i], stack_params["layers"])
        for i in range(num_layers)
    }


def stack_params(unrolled: dict, num_layers: int) -> dict:
    """``{"layer_i": leaves}`` -> ``{"layers": leaves [L, ...]}``."""
    layers = [unrolled[f"layer_{i}"] for i in range(num_layers)]
    return {"layers": jax.tree.map(lambda *ps: jnp.stack(ps), *layers)}
