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
from tfmjax.layers.moe import COLLECTION as MOE_COLLECTION

# A scanned stack of at most this many layers runs its loop unrolled (``nn.scan(unroll=L)``):
# the same stacked parameters and the same math, without the loop's per-step slicing and the
# zero-filled buffers its backward pass stacks residuals in (1.18x a step on the
# shakespeare_char shape on XLA:CPU, docs/cpu_speed.md). Deeper stacks keep the loop, so
# compile time stays one layer's.
UNROLL_MAX_LAYERS = 6


class LayerStack(nn.Module):
    """``x [B,T,D]``, per-layer ``cache`` (leading axis ``L``, or None) -> ``(x, cache)``.

    ``every = n`` with ``every_kwargs``: layers ``n-1, 2n-1, ...`` get ``every_kwargs`` on top
    of ``block_kwargs`` (a mixture-of-experts feed-forward every n-th block). Scanned, the
    stack then repeats a group of ``n`` blocks (``L`` a multiple of ``n``), whose params are
    ``layers/block_j`` with a leading ``[L/n]`` axis."""

    block: Any  # a block class, e.g. SelfAttentionBlock
    block_kwargs: dict  # keyword arguments of the block (its config)
    num_layers: int
    scan: bool = True
    remat: bool = False
    every: int = 1
    every_kwargs: Any = None  # dict or None

    def layer_kwargs(self, i: int) -> dict:
        """The keyword arguments of layer ``i``'s block."""
        special = self.every_kwargs and (i + 1) % self.every == 0
        return {**self.block_kwargs, **(self.every_kwargs if special else {})}

    @property
    def period(self) -> int:
        """Layers per scanned group: ``every`` when some layers differ, else 1."""
        return self.every if self.every_kwargs and self.every > 1 else 1

    @nn.compact
    def __call__(self, x, cache, inputs):
        block = nn.remat(self.block, prevent_cse=not self.scan) if self.remat else self.block
        per_layer = isinstance(cache, tuple)  # one cache per layer: updated in place (decoding)
        if self.scan:
            n, period = self.num_layers, self.period
            group_kwargs = tuple(self.layer_kwargs(j) for j in range(period))
            scanned = nn.scan(
                _Group if period > 1 else block,
                variable_axes={"params": 0, MOE_COLLECTION: 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(0, nn.broadcast),
                length=n // period,
                unroll=n // period if n <= UNROLL_MAX_LAYERS else 1,
                metadata_params={nn.PARTITION_NAME: LAYERS},
            )
            kwargs = {"block": block, "kwargs": group_kwargs} if period > 1 else group_kwargs[0]
            stacked = jax.tree.map(lambda *cs: jnp.stack(cs), *cache) if per_layer else cache
            grouped = jax.tree.map(lambda c: c.reshape(n // period, period, *c.shape[1:]), stacked)
            x, grouped = scanned(**kwargs, name="layers")(
                x, stacked if period == 1 else grouped, inputs
            )
            stacked = (
                grouped
                if period == 1
                else jax.tree.map(lambda c: c.reshape(n, *c.shape[2:]), grouped)
            )
            if per_layer:
                return x, tuple(layer_cache(stacked, i) for i in range(n))
            return x, stacked
        new_cache = []
        for i in range(self.num_layers):
            layer = None if cache is None else cache[i] if per_layer else layer_cache(cache, i)
            x, layer = block(**self.layer_kwargs(i), name=f"layer_{i}")(x, layer, inputs)
            new_cache.append(layer)
        if cache is None or per_layer:
            return x, None if cache is None else tuple(new_cache)
        return x, jax.tree.map(lambda *cs: jnp.stack(cs), *new_cache)


class _Group(nn.Module):
    """``len(kwargs)`` blocks in a row (one step of a scanned stack whose layers differ);
    ``cache`` leaves have a leading axis of ``len(kwargs)``."""

    block: Any
    kwargs: tuple

    @nn.compact
    def __call__(self, x, cache, inputs):
        caches = []
        for j, kwargs in enumerate(self.kwargs):
            layer = None if cache is None else layer_cache(cache, j)
            x, layer = self.block(**kwargs, name=f"block_{j}")(x, layer, inputs)
            caches.append(layer)
        return x, None if cache is None else jax.tree.map(lambda *cs: jnp.stack(cs), *caches)


def layer_cache(cache, i: int):
    """Layer ``i``'s cache from a stacked cache (leading axis ``L``) or a tuple of caches."""
    return cache[i] if isinstance(cache, tuple) else jax.tree.map(lambda c: c[i], cache)


def unstack_params(stack_params: dict, num_layers: int, period: int = 1) -> dict:
    """``{"layers": leaves [L, ...]}`` -> ``{"layer_i": leaves [...]}``; with ``period`` n
    (:class:`LayerStack` ``every``), ``{"layers": {"block_j": leaves [L/n, ...]}}`` ->
    layer ``g*n + j`` is ``block_j[g]``."""
    stacked = stack_params["layers"]
    if period == 1:
        return {f"layer_{i}": jax.tree.map(lambda p, i=i: p[i], stacked) for i in range(num_layers)}
    return {
        f"layer_{i}": jax.tree.map(lambda p, i=i: p[i // period], stacked[f"block_{i % period}"])
        for i in range(num_layers)
    }


def stack_params(unrolled: dict, num_layers: int, period: int = 1) -> dict:
    """``{"layer_i": leaves}`` -> ``{"layers": leaves [L, ...]}`` (the inverse of
    :func:`unstack_params`)."""

    def stack(layers):
        return jax.tree.map(lambda *ps: jnp.stack(ps), *layers)

    if period == 1:
        return {"layers": stack([unrolled[f"layer_{i}"] for i in range(num_layers)])}
    return {
        "layers": {
            f"block_{j}": stack([unrolled[f"layer_{i}"] for i in range(j, num_layers, period)])
            for j in range(period)
        }
    }
