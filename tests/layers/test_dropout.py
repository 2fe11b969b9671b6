"""Dropout with a traced rate (tfmjax.layers.dropout) against Flax's with a Python rate."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.dropout import Dropout

X = jnp.arange(1.0, 1.0 + 4 * 64).reshape(4, 64)
KEY = jax.random.key(3)


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5])
def test_an_array_rate_draws_flaxs_mask(rate):
    want = nn.Dropout(rate).apply({}, X, deterministic=False, rngs={"dropout": KEY})
    python = Dropout(rate).apply({}, X, deterministic=False, rngs={"dropout": KEY})
    np.testing.assert_array_equal(np.asarray(python), np.asarray(want))

    @jax.jit
    def traced(r):
        return Dropout(r).apply({}, X, deterministic=False, rngs={"dropout": KEY})

    np.testing.assert_allclose(np.asarray(traced(jnp.float32(rate))), np.asarray(want), rtol=1e-6)
    if rate == 0.0:  # Flax skips a rate of 0 in Python; the array rate keeps every element
        np.testing.assert_array_equal(np.asarray(traced(jnp.float32(0.0))), np.asarray(X))


def test_deterministic_ignores_an_array_rate():
    out = Dropout(jnp.float32(0.5)).apply({}, X, deterministic=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(X))
