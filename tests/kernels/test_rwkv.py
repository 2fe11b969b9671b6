"""The WKV operator of RWKV-4 (tfmjax.kernels.rwkv, Peng et al. 2023): the parallel form
(``jax.lax.associative_scan``) and the recurrence (``lax.scan`` of the stable step) against a
float64 NumPy loop of the paper's sums (eq. 16, written out, not stabilised), whole, in
pieces and on padding, with keys large enough that the plain float32 exponentials overflow;
gradients of both forms against central finite differences of that loop, and against each
other.

Tolerances: max abs error at most ``RTOL = 2e-5`` of the largest magnitude for values
(float32 against the float64 loop; ``BIG_RTOL = 2e-5`` too with keys near 100, whose float32
rounding alone is 4e-6 of a weight's exponent), ``GTOL = 1e-4`` for gradients (float32
against float64 central differences, step 1e-6).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels import rwkv as R

RTOL, GTOL, BIG_RTOL = 2e-5, 1e-4, 2e-5
FORMS = {"parallel": R.wkv_parallel, "recurrent": R.wkv_recurrent}


def inputs(B, T, D, seed=0, shift=0.0):
    """``w [D]`` (> 0), ``u [D]``, ``k, v [B,T,D]`` float32 (``k`` plus ``shift``)."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape)  # noqa: E731
    w, u, k, v = np.exp(f(D)), f(D), 2 * f(B, T, D) + shift, f(B, T, D)
    return [np.asarray(x, np.float32) for x in (w, u, k, v)]


def oracle(w, u, k, v, keep=None, past=None):
    """The paper's ``wkv_t`` (float64): ``(sum_{i<t} e^{-(t-1-i)w + k_i} v_i + e^{u+k_t}
    v_t) / (same with 1 for v)``, the sums over the kept positions ``i`` (a padding position
    neither adds nor decays), after ``past = (k, v)`` tokens seen before (a prompt)."""
    w, u, k, v = (np.asarray(x, np.float64) for x in (w, u, k, v))
    B, T, D = k.shape
    keep = np.ones((B, T), bool) if keep is None else np.asarray(keep, bool)
    if past is not None:
        pk, pv = (np.asarray(x, np.float64) for x in past)
        k, v = np.concatenate([pk, k], 1), np.concatenate([pv, v], 1)
        keep = np.concatenate([np.ones(pk.shape[:2], bool), keep], 1)
    out = np.zeros(k.shape)
    for b in range(B):
        kept = np.flatnonzero(keep[b])
        for t in range(k.shape[1]):
            now = np.exp(u + k[b, t])
            num, den = now * v[b, t], now.copy()
            for i in kept[kept < t]:
                gap = np.sum(kept[kept < t] > i)  # kept steps between i and t
                e = np.exp(-gap * w + k[b, i])
                num, den = num + e * v[b, i], den + e
            out[b, t] = num / den
    return out[:, -T:]


def assert_rel(got, want, tol, name):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.all(np.isfinite(got)), f"{name} has non-finite values"
    err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
    assert err <= tol * scale, f"{name}: max abs error {err:.2e} > {tol} x {scale:.2e}"


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("shift,tol", [(0.0, RTOL), (100.0, BIG_RTOL)], ids=["keys", "big_keys"])
def test_forms_match_the_papers_sums(form, shift, tol):
    w, u, k, v = inputs(2, 9, 5, shift=shift)
    if shift:  # e^{k} alone overflows float32: only the carried exponent keeps it finite
        with np.errstate(over="ignore"):
            assert not np.all(np.isfinite(np.exp(k)))
    keep = np.ones((2, 9), bool)
    keep[1, :3] = keep[1, 5] = False  # left padding and a gap
    state = R.init_wkv_state(2, 5)
    y, _ = jax.jit(FORMS[form])(w, u, k, v, state, jnp.asarray(keep))
    want = oracle(w, u, k, v, keep)
    assert_rel(np.asarray(y)[keep], want[keep], tol, f"{form} wkv")


@pytest.mark.parametrize("form", list(FORMS))
def test_a_carried_state_continues_the_sums(form):
    """A prompt of 5 by the parallel form, then the rest by ``form`` from its state."""
    w, u, k, v = inputs(2, 8, 4, seed=1)
    y1, state = jax.jit(R.wkv_parallel)(w, u, k[:, :5], v[:, :5], R.init_wkv_state(2, 4))
    y2, state = jax.jit(FORMS[form])(w, u, k[:, 5:], v[:, 5:], state)
    assert_rel(np.concatenate([y1, y2], 1), oracle(w, u, k, v), RTOL, form)
    y3, _ = jax.jit(R.wkv_recurrent)(w, u, k[:, :1], v[:, :1], state)  # one more token
    want = oracle(w, u, k[:, :1], v[:, :1], past=(k, v))
    assert_rel(y3, want, RTOL, f"{form} then a step")


def test_padding_leaves_the_state_untouched():
    w, u, k, v = inputs(1, 6, 3, seed=2)
    state = R.init_wkv_state(1, 3)
    _, plain = jax.jit(R.wkv_parallel)(w, u, k, v, state)
    pad = lambda x: np.concatenate([np.ones_like(x[:, :2]) * 7, x], 1)  # noqa: E731
    keep = jnp.asarray([[False, False] + [True] * 6])
    for form in FORMS.values():
        _, padded = jax.jit(form)(w, u, pad(k), pad(v), state, keep)
        for n in "abp":
            assert_rel(padded[n], plain[n], RTOL, n)


def test_gradients_match_finite_differences_of_the_papers_sums():
    """``d sum(wkv * g)`` by ``jax.grad`` of both forms, with respect to ``w, u, k, v``,
    against central differences of :func:`oracle` (float64), entry by entry."""
    w, u, k, v = inputs(2, 5, 3, seed=3)
    g = np.random.default_rng(4).standard_normal(k.shape)
    args = [w, u, k, v]

    def numeric(i):
        grad = np.zeros(args[i].shape)
        for idx in np.ndindex(args[i].shape):
            plus = [np.asarray(a, np.float64) for a in args]
            minus = [a.copy() for a in plus]
            plus[i][idx] += 1e-6
            minus[i][idx] -= 1e-6
            grad[idx] = np.sum((oracle(*plus) - oracle(*minus)) * g) / 2e-6
        return grad

    want = [numeric(i) for i in range(4)]
    for name, form in FORMS.items():
        loss = lambda *a, form=form: jnp.sum(form(*a, R.init_wkv_state(2, 3))[0] * g)  # noqa: E731
        got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(*args)
        for arg, gw, gg in zip("wukv", want, got, strict=True):
            assert_rel(gg, gw, GTOL, f"{name} d/d{arg}")


def test_shapes_are_checked():
    w, u, k, v = inputs(1, 3, 4)
    with pytest.raises(ValueError, match="wkv shapes"):
        R.wkv_parallel(w[:3], u, k, v, R.init_wkv_state(1, 4))
