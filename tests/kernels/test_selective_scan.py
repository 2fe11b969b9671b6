"""The selective scan of Mamba (tfmjax.kernels.selective_scan, Gu & Dao 2023): the parallel
form (``jax.lax.associative_scan``) and the recurrent form against a NumPy loop written from
the paper's recurrence, and against each other in values and gradients; the causal
convolution against a NumPy loop, whole and in pieces.

Tolerances: max abs error at most ``RTOL = 2e-5`` of the largest magnitude for values
(float32 against the float64 oracle), ``GTOL = 1e-4`` for gradients (two float32 orders).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels import selective_scan as S

RTOL, GTOL = 2e-5, 1e-4
ARGS = ("u", "delta", "a", "bm", "cm", "h0")


def inputs(B, T, E, P, seed=0, zero_state=False):
    """``u, delta, a, bm, cm, h0`` as a layer makes them (delta > 0, a < 0)."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    u, bm, cm = f(B, T, E), f(B, T, P), f(B, T, P)
    delta = np.log1p(np.exp(f(B, T, E) - 1.0))  # softplus
    delta[0, :2] = 0.0  # as on padding: the state passes through
    a = -np.exp(f(E, P) * 0.5)
    h0 = np.zeros((B, E, P), np.float32) if zero_state else f(B, E, P)
    return [jnp.asarray(x) for x in (u, delta, a, bm, cm, h0)]


def oracle(u, delta, a, bm, cm, h0):
    """``h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t``, ``y_t = h_t C_t`` (float64)."""
    u, delta, a, bm, cm, h = (np.asarray(x, np.float64) for x in (u, delta, a, bm, cm, h0))
    B, T, E = u.shape
    y = np.zeros((B, T, E))
    for t in range(T):
        for b in range(B):
            for e in range(E):
                h[b, e] = (
                    np.exp(delta[b, t, e] * a[e]) * h[b, e] + delta[b, t, e] * bm[b, t] * u[b, t, e]
                )
                y[b, t, e] = h[b, e] @ cm[b, t]
    return y, h


def assert_rel(got, want, tol, name):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.all(np.isfinite(got)), f"{name} has non-finite values"
    err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
    assert err <= tol * scale, f"{name}: max abs error {err:.2e} > {tol} x {scale:.2e}"


FORMS = {"parallel": S.selective_scan, "recurrent": S.selective_scan_recurrent}


@pytest.mark.parametrize("shape", [(2, 9, 3, 4), (1, 1, 2, 3), (1, 16, 4, 2)])
def test_both_forms_equal_the_oracle_and_each_others_gradients(shape):
    args = inputs(*shape)
    d_y = jnp.asarray(np.random.default_rng(9).standard_normal(args[0].shape, np.float32))
    want_y, want_h = oracle(*args)
    grads = {}
    for name, form in FORMS.items():

        def loss(*xs, form=form):
            y, h = form(*xs)
            return jnp.sum(y * d_y) + jnp.sum(h), (y, h)

        f = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(6)), has_aux=True))
        (_, (y, h)), grads[name] = f(*args)
        assert_rel(y, want_y, RTOL, f"{name} y")
        assert_rel(h, want_h, RTOL, f"{name} h")
    for arg, g, w in zip(ARGS, grads["parallel"], grads["recurrent"], strict=True):
        assert_rel(g, w, GTOL, f"d{arg}")


def test_pieces_from_the_carried_state_equal_the_whole():
    u, delta, a, bm, cm, h0 = inputs(2, 10, 3, 4, seed=2)
    scan = jax.jit(S.selective_scan)
    whole, h_whole = scan(u, delta, a, bm, cm, h0)
    h, ys = h0, []
    for lo, hi in [(0, 7), (7, 8), (8, 10)]:
        y, h = scan(u[:, lo:hi], delta[:, lo:hi], a, bm[:, lo:hi], cm[:, lo:hi], h)
        ys.append(y)
    assert_rel(jnp.concatenate(ys, axis=1), whole, RTOL, "y")
    assert_rel(h, h_whole, RTOL, "h")


def conv_oracle(x, kernel, bias):
    """``out_t = bias + sum_i kernel[i] x_{t-W+1+i}``, zeros before the start (float64)."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    W, T = kernel.shape[0], x.shape[1]
    out = np.broadcast_to(np.asarray(bias, np.float64), x.shape).copy()
    for t in range(T):
        for i in range(W):
            if t - W + 1 + i >= 0:
                out[:, t] += kernel[i] * x[:, t - W + 1 + i]
    return out


@pytest.mark.parametrize("W", [1, 4])
def test_causal_conv_equals_the_oracle_whole_and_in_pieces(W):
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 7, 3), np.float32))
    kernel = jnp.asarray(rng.standard_normal((W, 3), np.float32))
    bias = jnp.asarray(rng.standard_normal(3, np.float32))
    want = conv_oracle(x, kernel, bias)
    zero = jnp.zeros((2, W - 1, 3))
    got, state = S.causal_conv(x, kernel, bias, zero)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(state, x[:, x.shape[1] - (W - 1) :])
    state, pieces = zero, []
    for lo, hi in [(0, 2), (2, 3), (3, 7)]:
        out, state = S.causal_conv(x[:, lo:hi], kernel, bias, state)
        pieces.append(out)
    np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), want, rtol=1e-5, atol=1e-5)


def test_bad_shapes_get_one_line_errors():
    u, delta, a, bm, cm, h0 = inputs(1, 3, 2, 4)
    with pytest.raises(ValueError, match="selective scan shapes"):
        S.selective_scan(u, delta, a, bm[:, :, :2], cm, h0)
    with pytest.raises(ValueError, match="conv state must be"):
        S.causal_conv(u, jnp.ones((4, 2)), jnp.zeros(2), jnp.zeros((1, 2, 2)))
