"""The tied output projection ``logits = x E^T`` (``tfmjax.layers.embeddings.tied_logits``):
float32 logits, and a backward whose matmuls run in the compute dtype.

Its twin is plain autodiff of the same einsum: equal in float32; in bfloat16 within the
rounding of the cotangent, and with no float32 matmul (autodiff multiplies the float32
cotangent by the bfloat16 operands: a float32 matmul on GPU).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.embeddings import tied_logits


def _autodiff_twin(x, table):
    return jnp.einsum("BTD,VD->BTV", x, table, preferred_element_type=jnp.float32)


def _grads(fn, x, table, g):
    _, vjp = jax.vjp(fn, x, table)
    return vjp(g)


def _inputs(dtype, rng):
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    table = rng.normal(size=(11, 8)).astype(np.float32)
    g = rng.normal(size=(2, 5, 11)).astype(np.float32)
    return jnp.asarray(x, dtype), jnp.asarray(table, dtype), jnp.asarray(g)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 5e-2)])
def test_values_and_grads_match_autodiff(dtype, tol, rng):
    x, table, g = _inputs(dtype, rng)
    got, want = tied_logits(x, table), _autodiff_twin(x, table)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)
    pairs = zip(_grads(tied_logits, x, table, g), _grads(_autodiff_twin, x, table, g), strict=True)
    for a, b in pairs:
        assert a.dtype == b.dtype == dtype
        np.testing.assert_allclose(np.float32(a), np.float32(b), atol=tol, rtol=tol)


def test_bfloat16_backward_has_no_float32_matmul(rng):
    x, table, g = _inputs(jnp.bfloat16, rng)

    def operand_types(fn):
        text = jax.jit(lambda x, t: _grads(fn, x, t, g)).lower(x, table).as_text()
        return re.findall(r"dot_general .*: \(tensor<(?:\d+x)*(\w+)>, tensor<(?:\d+x)*(\w+)>", text)

    assert operand_types(tied_logits) == [("bf16", "bf16")] * 2  # dx, dtable
    assert operand_types(_autodiff_twin) == [("f32", "f32")] * 2  # what it replaces
