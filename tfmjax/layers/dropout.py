"""Dropout whose rate may be a traced array: Flax's ``nn.Dropout`` for a Python rate (the
same module name, scope and bits), and for an array rate the same mask drawn without the
Python branches on the rate.

Flax skips a rate of 0 in Python (no mask, no key drawn), so one program cannot hold runs
with rates 0 and 0.1. With an array rate (``tfmjax.train.stacked`` vmaps the step over runs
with their own rates) every rate draws its key and mask; at rate 0 the mask keeps every
element (``uniform < 1`` always) and ``x / 1`` is ``x``, so the output is the input, as
Flax's skip gives. The key comes from this module's own scope, so drawing it changes no
other module's keys.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.module import merge_param


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same fields and name) that also takes a ``jax.Array`` rate."""

    @nn.compact
    def __call__(self, inputs, deterministic: bool | None = None, rng=None):
        if not isinstance(self.rate, jax.Array):
            return super().__call__(inputs, deterministic, rng)
        if merge_param("deterministic", self.deterministic, deterministic):
            return inputs
        keep_prob = 1.0 - self.rate
        if rng is None:
            rng = self.make_rng(self.rng_collection)
        shape = list(inputs.shape)
        for dim in self.broadcast_dims:
            shape[dim] = 1
        mask = jnp.broadcast_to(jax.random.bernoulli(rng, p=keep_prob, shape=shape), inputs.shape)
        return jax.lax.select(mask, inputs / keep_prob.astype(inputs.dtype), jnp.zeros_like(inputs))
