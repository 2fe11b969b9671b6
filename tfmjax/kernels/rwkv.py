"""The WKV operator of RWKV-4 (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer
Era", eq. 14-16 and Appendix D), per channel.

With a per-channel decay ``w [D]`` (``w >= 0``; each step multiplies the past by ``e^-w``),
a bonus ``u [D]`` for the current token and keys, values ``k, v [B,T,D]``:

    wkv_t = (sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t)
          / (sum_{i<t} e^{-(t-1-i) w + k_i}     + e^{u + k_t})

The sums are carried as a state of three ``[B,D]`` float32 arrays: ``a`` and ``b``, the
numerator and denominator, both scaled by ``e^-p``, and ``p``, their exponent (the running
maximum of the official CUDA kernel and of ChatRWKV's ``wkv``): ``e^p a`` and ``e^p b`` never
overflow however large the keys. Adding ``e^q (a', b')`` to ``e^p (a, b)`` is the stable sum
:func:`_add` (exponent ``max(p, q)``); the exponent is constant for differentiation (the
sum's value does not depend on it), so gradients are those of the plain formula.

* :func:`wkv_parallel`: the training form, every state at once by
  ``jax.lax.associative_scan`` over the affine maps ``S -> e^d S + e^q (a, b)``
  (``d = -w`` a step), composed as ``(d1, s1) o (d2, s2) = (d1 + d2, e^{d2} s1 + s2)``:
  O(T D) memory, log-depth.
* :func:`wkv_recurrent`: one token at a time (``lax.scan`` of :func:`wkv_step`), the
  decoding form and the paper's recurrence (Appendix D) as the official code runs it.

Both start from a carried state (:func:`init_wkv_state`: nothing seen) and return the last,
so decoding (a prompt, then one token per step) continues where the previous call stopped.
``keep [B,T]`` (False at padding) leaves the state untouched at a position: no decay, no
input. Every sum is float32.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

NOTHING = -1e38  # the exponent of the empty sum (ChatRWKV's initial ``pp``)


def init_wkv_state(batch: int, width: int) -> dict:
    """The state of no tokens: ``a, b = 0``, ``p = -1e38``, each ``[B,D]`` float32."""
    zeros = jnp.zeros((batch, width), jnp.float32)
    return {"a": zeros, "b": zeros, "p": jnp.full((batch, width), NOTHING, jnp.float32)}


def _add(a1, b1, p1, a2, b2, p2):
    """``e^p1 (a1, b1) + e^p2 (a2, b2)`` as ``(a, b, p)``, ``p = max(p1, p2)`` (a constant for
    the gradient: the sum does not depend on it)."""
    p = lax.stop_gradient(jnp.maximum(p1, p2))
    e1, e2 = jnp.exp(p1 - p), jnp.exp(p2 - p)
    return e1 * a1 + e2 * a2, e1 * b1 + e2 * b2, p


def _check(w, u, k, v, state):
    B, T, D = k.shape
    got = {"w": w.shape, "u": u.shape, "v": v.shape, **{n: s.shape for n, s in state.items()}}
    want = {"w": (D,), "u": (D,), "v": (B, T, D), "a": (B, D), "b": (B, D), "p": (B, D)}
    got = {name: tuple(shape) for name, shape in got.items()}
    if got != want:
        raise ValueError(f"wkv shapes {got} do not match {want} for k {k.shape}")


def _inputs(w, u, k, v, keep):
    """float32 ``w, u [D]``, ``k, v [B,T,D]`` and ``keep [B,T,1]`` (all True when None)."""
    f = lambda x: x.astype(jnp.float32)  # noqa: E731
    keep = jnp.ones(k.shape[:2], bool) if keep is None else keep.astype(bool)
    return f(w), f(u), f(k), f(v), keep[..., None]


def wkv_step(state: dict, w, u, k, v, keep=None):
    """One token: ``k, v [B,D]``, ``keep [B]`` -> ``(wkv [B,D] float32, new state)``."""
    a, b, p = state["a"], state["b"], state["p"]
    ones = jnp.ones_like(v)
    wa, wb, _ = _add(a, b, p, v, ones, u[None] + k)
    new = dict(zip("abp", _add(a, b, p - w[None], v, ones, k), strict=True))
    if keep is not None:
        new = {n: jnp.where(keep[:, None], s, state[n]) for n, s in new.items()}
    return wa / wb, new


def wkv_recurrent(w, u, k, v, state: dict, keep=None):
    """The recurrence, one token at a time: ``w, u [D]``, ``k, v [B,T,D]``, ``state`` (``a, b,
    p [B,D]``), ``keep [B,T]`` -> ``(wkv [B,T,D] float32, state after the sequence)``."""
    _check(w, u, k, v, state)
    w, u, k, v, keep = _inputs(w, u, k, v, keep)

    def step(s, xs):
        y, s = wkv_step(s, w, u, *xs)
        return s, y

    xs = (jnp.moveaxis(k, 1, 0), jnp.moveaxis(v, 1, 0), jnp.moveaxis(keep[..., 0], 1, 0))
    state, y = lax.scan(step, state, xs)
    return jnp.moveaxis(y, 0, 1), state


def _compose(first, second):
    """The affine map ``first`` then ``second``, each ``(d, a, b, p)``: ``S -> e^d S + e^p (a,
    b)``."""
    d1, a1, b1, p1 = first
    d2, a2, b2, p2 = second
    return (d1 + d2, *_add(a1, b1, p1 + d2, a2, b2, p2))


def wkv_states(w, k, v, state: dict, keep=None):
    """Every state of the parallel form, after each token: ``(a, b, p)``, each ``[B,T,D]``
    float32 (``w [D]``, ``k, v [B,T,D]``, the carried ``state``, ``keep [B,T]``)."""
    w, _, k, v, keep = _inputs(w, w, k, v, keep)
    d = jnp.where(keep, -w[None, None], 0.0)  # a padding step: identity (no decay, no input)
    a, b = jnp.where(keep, v, 0.0), jnp.where(keep, jnp.ones_like(v), 0.0)
    p = jnp.where(keep, k, NOTHING)
    # Fold the carried state into the first map: S_0 = e^{d_0} S_-1 + e^{p_0} (a_0, b_0).
    a0, b0, p0 = _add(state["a"], state["b"], state["p"] + d[:, 0], a[:, 0], b[:, 0], p[:, 0])
    a, b, p = a.at[:, 0].set(a0), b.at[:, 0].set(b0), p.at[:, 0].set(p0)
    return lax.associative_scan(_compose, (d, a, b, p), axis=1)[1:]


def wkv_parallel(w, u, k, v, state: dict, keep=None):
    """The parallel form; same arguments and results as :func:`wkv_recurrent`."""
    _check(w, u, k, v, state)
    a, b, p = wkv_states(w, k, v, state, keep)
    last = {"a": a[:, -1], "b": b[:, -1], "p": p[:, -1]}
    # The state before each token: the carried one, then the states after 0 .. T-2.
    before = [
        jnp.concatenate([state[n][:, None], s[:, :-1]], 1)
        for n, s in zip("abp", (a, b, p), strict=True)
    ]
    _, u, k, v, _ = _inputs(w, u, k, v, None)
    wa, wb, _ = _add(*before, v, jnp.ones_like(v), u[None, None] + k)
    return wa / wb, last
