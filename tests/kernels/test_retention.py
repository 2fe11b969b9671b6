"""Retention (tfmjax.kernels.retention, Sun et al. 2023): the parallel, recurrent and
chunkwise forms against a NumPy loop written from the paper's formulas, and against each
other in values and gradients.

Tolerances (float32 against the float64 oracle, or two float32 summation orders): max abs
error at most ``RTOL = 2e-5`` of the largest magnitude for values, ``GTOL = 1e-4`` for
gradients.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels import retention as R

RTOL, GTOL = 2e-5, 1e-4


def inputs(B, T, N, H, J, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((B, T, N, H), (B, T, N, H), (B, T, N, J), (B, T, N, J))
    return [jnp.asarray(rng.standard_normal(s, np.float32)) for s in shapes]


def oracle(q, k, v, gamma, mask=None, state=None):
    """The paper's formulas, literally, in float64: ``o_t = sum_{s<=t} gamma^(t-s) (q_t .
    k_s) v_s + gamma^(t+1) q_t S0`` and the final ``S_T = gamma^T S0 + sum_s gamma^(T-1-s)
    k_s^T v_s`` (masked keys left out)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, N, _ = q.shape
    S0 = (
        np.zeros((B, N, q.shape[3], v.shape[3])) if state is None else np.asarray(state, np.float64)
    )
    keep = np.ones((B, T)) if mask is None else np.asarray(mask, np.float64)
    out = np.zeros(v.shape)
    S = S0 * gamma[None, :, None, None] ** T
    for b in range(B):
        for n in range(N):
            g = gamma[n]
            for t in range(T):
                out[b, t, n] = g ** (t + 1) * q[b, t, n] @ S0[b, n]
                for s in range(t + 1):
                    out[b, t, n] += (
                        g ** (t - s) * keep[b, s] * (q[b, t, n] @ k[b, s, n]) * v[b, s, n]
                    )
            for s in range(T):
                S[b, n] += g ** (T - 1 - s) * keep[b, s] * np.outer(k[b, s, n], v[b, s, n])
    return out, S


def assert_rel(got, want, tol, name):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
    assert err <= tol * scale, f"{name}: max abs error {err:.2e} > {tol} x {scale:.2e}"


def test_decays_are_the_papers():
    lg = R.retention_decays(4)
    np.testing.assert_allclose(np.exp(lg), [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256])
    d = np.asarray(R.decay_mask(lg, 3))
    np.testing.assert_allclose(
        d[0], [[1, 0, 0], [31 / 32, 1, 0], [(31 / 32) ** 2, 31 / 32, 1]], rtol=1e-6
    )


def all_forms(state, chunk_size):
    """``{form: f(q, k, v, mask) -> (out, state)}`` (the parallel form starts from zero)."""

    def parallel(q, k, v, mask):
        return R.retention_parallel(q, k, v, lg_of(q), kv_mask=mask), None

    def recurrent(q, k, v, mask):
        return R.retention_recurrent(state, q, k, v, lg_of(q), kv_mask=mask)

    def chunkwise(q, k, v, mask):
        return R.retention_chunkwise(state, q, k, v, lg_of(q), kv_mask=mask, chunk_size=chunk_size)

    return {"parallel": parallel, "recurrent": recurrent, "chunkwise": chunkwise}


def lg_of(q):
    return R.retention_decays(q.shape[2])


# name: (B, T, N, H, J, chunk_size, left padding of row 0, nonzero start state)
CASES = {
    "ragged_chunk5_leftpad": (2, 13, 3, 4, 6, 5, 3, False),
    "chunk1_state": (1, 7, 2, 8, 8, 1, 0, True),
    "exact_chunks_state": (2, 12, 2, 4, 4, 4, 2, True),
    "chunk_longer_than_T": (1, 6, 4, 4, 4, 64, 0, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forms_equal_the_paper_oracle_in_values_and_gradients(case):
    B, T, N, H, J, C, pad, with_state = CASES[case]
    q, k, v, d_out = inputs(B, T, N, H, J)
    mask = np.ones((B, T), np.int32)
    mask[0, :pad] = 0
    mask = jnp.asarray(mask)
    rng = np.random.default_rng(1)
    state = jnp.asarray(rng.standard_normal((B, N, H, J), np.float32)) if with_state else None
    gamma = np.exp(R.retention_decays(N))
    want_out, want_state = oracle(q, k, v, gamma, mask, state)
    s0 = R.init_retention_state(B, N, H, J) if state is None else state
    forms = all_forms(s0, C)
    if with_state:
        del forms["parallel"]  # it starts from zero
    results = {}
    for name, f in forms.items():

        def loss(q, k, v, f=f):
            out, s = f(q, k, v, mask)
            total = jnp.sum(out * d_out)
            return total + (0.0 if s is None else jnp.sum(s)), (out, s)

        (_, (out, s)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
            q, k, v
        )
        assert_rel(out, want_out, RTOL, f"{name} out")
        if s is not None:
            assert_rel(s, want_state, RTOL, f"{name} state")
        results[name] = grads
    first = results["recurrent"]
    for name, grads in results.items():
        for which, g, w in zip("qkv", grads, first, strict=True):
            assert np.all(np.isfinite(np.asarray(g)))
            if name != "parallel":  # the parallel form's loss has no state term
                assert_rel(g, w, GTOL, f"{name} d{which}")


def test_parallel_gradients_equal_the_chunkwise_form_without_state_term():
    q, k, v, d_out = inputs(2, 11, 2, 4, 4, seed=3)
    lg = R.retention_decays(2)
    s0 = R.init_retention_state(2, 2, 4, 4)
    par = lambda q, k, v: jnp.sum(R.retention_parallel(q, k, v, lg) * d_out)
    chk = lambda q, k, v: jnp.sum(R.retention_chunkwise(s0, q, k, v, lg, chunk_size=4)[0] * d_out)
    g_par = jax.jit(jax.grad(par, argnums=(0, 1, 2)))(q, k, v)
    g_chk = jax.jit(jax.grad(chk, argnums=(0, 1, 2)))(q, k, v)
    for which, g, w in zip("qkv", g_chk, g_par, strict=True):
        assert_rel(g, w, GTOL, f"d{which}")


def test_feeding_in_pieces_equals_the_whole():
    """A prompt, then one token at a time, from the carried state: the whole sequence."""
    q, k, v, _ = inputs(2, 9, 2, 4, 4, seed=5)
    lg = R.retention_decays(2)
    whole = R.retention_parallel(q, k, v, lg)
    step = jax.jit(functools.partial(R.retention_chunkwise, chunk_size=4))
    state, outs = R.init_retention_state(2, 2, 4, 4), []
    for lo, hi in [(0, 6), (6, 7), (7, 8), (8, 9)]:
        out, state = step(state, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], lg)
        outs.append(out)
    assert_rel(jnp.concatenate(outs, axis=1), whole, RTOL, "pieces")


def test_bad_arguments_get_one_line_errors():
    q = jnp.zeros((1, 3, 2, 4))
    lg = R.retention_decays(2)
    s0 = R.init_retention_state(1, 2, 4, 4)
    cases = [
        (lambda: R.retention_parallel(q, q[:, :2], q, lg), "want q, k"),
        (lambda: R.retention_parallel(q, q, q, R.retention_decays(3)), "log_gamma"),
        (lambda: R.retention_parallel(q, q, q, lg, kv_mask=jnp.ones((1, 2))), "kv_mask"),
        (lambda: R.retention_chunkwise(s0[:, :1], q, q, q, lg), "state must be"),
        (lambda: R.retention_chunkwise(s0, q, q, q, lg, chunk_size=0), "chunk_size"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
