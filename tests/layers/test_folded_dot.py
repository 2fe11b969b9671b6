"""folded_dot_general: the dense layers' dot_general as one 2-D matmul, against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.folded_dot import folded_dot_general

RTOL = ATOL = 1e-5  # float32, contractions of up to 32 terms


@pytest.mark.parametrize(
    ("lhs_shape", "rhs_shape", "k"),
    [((3, 4, 8), (8, 5), 1), ((2, 3, 4, 8), (4, 8, 6), 2), ((3, 8), (8, 2, 5), 1)],
)
def test_matches_numpy_tensordot_and_gradients(lhs_shape, rhs_shape, k):
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal(lhs_shape).astype(np.float32)
    rhs = rng.standard_normal(rhs_shape).astype(np.float32)
    dims = ((tuple(range(len(lhs_shape) - k, len(lhs_shape))), tuple(range(k))), ((), ()))
    out = folded_dot_general(jnp.asarray(lhs), jnp.asarray(rhs), dims)
    np.testing.assert_allclose(out, np.tensordot(lhs, rhs, axes=k), rtol=RTOL, atol=ATOL)
    # The cotangents of sum(out * c): c contracted with the other operand, by NumPy.
    c = rng.standard_normal(out.shape).astype(np.float32)
    grads = jax.grad(lambda a, b: jnp.sum(folded_dot_general(a, b, dims) * c), (0, 1))(lhs, rhs)
    free_l, free_r = len(lhs_shape) - k, len(rhs_shape) - k
    want_l = np.tensordot(
        c, rhs, axes=(list(range(free_l, free_l + free_r)), list(range(k, k + free_r)))
    )
    want_r = np.tensordot(lhs, c, axes=(list(range(free_l)), list(range(free_l))))
    np.testing.assert_allclose(grads[0], want_l, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads[1], want_r, rtol=RTOL, atol=ATOL)


def test_negative_axes_and_unfoldable_dims_fall_back_exactly():
    rng = np.random.default_rng(1)
    lhs = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((2, 4, 5)), jnp.float32)
    # negative contracting axis, as DenseGeneral(axis=-1) may pass it
    rhs2 = rhs[0]
    got = folded_dot_general(lhs, rhs2, (((-1,), (0,)), ((), ())))
    np.testing.assert_allclose(got, np.tensordot(lhs, rhs2, axes=1), rtol=RTOL, atol=ATOL)
    # a batch dimension: not folded, the same as lax.dot_general bit for bit
    dims = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(
        folded_dot_general(lhs, rhs, dims), jax.lax.dot_general(lhs, rhs, dims)
    )
