"""A stack of ``L`` identical blocks, scanned (``nn.scan``) or unrolled, with optional remat.

Blocks have the signature ``block(x, cache, inputs) -> (x, cache)``. Scanned parameters
carry a leading ``[L]`` axis under ``layers``; unrolled ones live in ``layer_0 .. layer_{L-1}``.
:func:`unstack_params` and :func:`stack_params` convert between the two layouts.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class LayerStack(nn.Module):
    """``x [B,T,D]``, per-layer ``cache`` (leading axis ``L``, or None) -> ``(x, cache)``."""
    block: Any                     # a block class, e.g. SelfAttentionBlock
    block_kwargs: dict             # keyword arguments of the block (its config)
    num_layers: int
    scan: bool = True
    remat: bool = False

    @nn.compact
    def __call__(self, x, cache, inputs):
        block = nn.remat(self.block, prevent_cse=not self.scan) if self.remat else self.block
        if self.scan:
            scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True,
                              "dropout": True}, in_axes=(0, nn.broadcast), length=self.num_layers)
            return scanned(**self.block_kwargs, name="layers")(x, cache, inputs)
        new_cache = []
        for i in range(self.num_layers):
            layer_cache = None if cache is None else jax.tree.map(lambda c: c[i], cache)
            x, layer_cache = block(**self.block_kwargs, name=f"layer_{i}")(x, layer_cache, inputs)
            new_cache.append(layer_cache)
        if cache is None:
            return x, None
        return x, jax.tree.map(lambda *cs: jnp.stack(cs), *new_cache)


def unstack_params(stack_params: dict, num_layers: int) -> dict:
    """``{"layers": leaves [L, ...]}`` -> ``{"layer_i": leaves [...]}``."""
    return {f"layer_{i}": jax.tree.map(lambda p: p[i], stack_params["layers"])
            for i in range(num_layers)}


def stack_params(unrolled: dict, num_layers: int) -> dict:
    """``{"layer_i": leaves}`` -> ``{"layers": leaves [L, ...]}``."""
    layers = [unrolled[f"layer_{i}"] for i in range(num_layers)]
    return {"layers": jax.tree.map(lambda *ps: jnp.stack(ps), *layers)}
