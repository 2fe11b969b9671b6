"""The selective scan of Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces", Algorithm 2) and its causal depthwise convolution.

Letters: ``E`` channels (the block's inner width), ``P`` state size per channel (the paper's
``N``, which names query heads here), ``W`` the convolution width. With input-dependent step
``delta [B,T,E]`` (positive), ``Bm, Cm [B,T,P]`` and a diagonal ``A [E,P]`` (negative), the
zero-order-hold discretisation (``B`` simplified to Euler, as in the paper's code) gives

    h_t = exp(delta_t A) * h_{t-1} + delta_t Bm_t u_t      [B,E,P]
    y_t = h_t . Cm_t                                        [B,E]

* :func:`selective_scan`: the parallel form, every ``h_t`` at once by
  ``jax.lax.associative_scan`` over the pairs ``(a_t, b_t)`` with
  ``(a, b) o (a', b') = (a a', a' b + b')`` (O(T E P) memory: ``h`` is materialised).
* :func:`selective_scan_recurrent`: one token at a time (``lax.scan``).
* :func:`selective_scan_states` and :func:`read_states`: the parallel form's two halves
  (every state ``h_t``, then ``y_t = h_t . Cm_t``), for the hook ``hook_h`` of
  :mod:`tfmjax.layers.selective_scan`.

Both start from a carried state ``h0 [B,E,P]`` and return the last state, so decoding (a
prompt, then one token per step) continues exactly where the previous call stopped. A
position with ``delta = 0`` leaves the state untouched (decay 1, no input): the layer sets
it on padding. Every sum is float32; ``y`` has u's dtype.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def _check(u, delta, a, bm, cm, h0):
    B, T, E = u.shape
    P = a.shape[-1]
    want = {"delta": (B, T, E), "a": (E, P), "bm": (B, T, P), "cm": (B, T, P), "h0": (B, E, P)}
    got = {"delta": delta.shape, "a": a.shape, "bm": bm.shape, "cm": cm.shape, "h0": h0.shape}
    got = {name: tuple(shape) for name, shape in got.items()}
    if got != want:
        raise ValueError(f"selective scan shapes {got} do not match {want} for u {u.shape}")


def _discretise(u, delta, a, bm):
    """``exp(delta A)`` and ``delta Bm u``, both ``[B,T,E,P]`` float32."""
    delta = delta.astype(jnp.float32)
    decay = jnp.exp(delta[..., None] * a.astype(jnp.float32)[None, None])
    drive = (delta * u.astype(jnp.float32))[..., None] * bm.astype(jnp.float32)[:, :, None, :]
    return decay, drive


def _combine(left, right):
    (a1, b1), (a2, b2) = left, right
    return a1 * a2, a2 * b1 + b2


def selective_scan_states(u, delta, a, bm, h0):
    """Every state of the parallel form, ``h [B,T,E,P]`` (float32): ``u, delta [B,T,E]``,
    ``a [E,P]``, ``bm [B,T,P]``, ``h0 [B,E,P]``."""
    _check(u, delta, a, bm, bm, h0)
    decay, drive = _discretise(u, delta, a, bm)
    # Fold the carried state into the first step: h_1 = a_1 h0 + b_1.
    drive = drive.at[:, 0].add(decay[:, 0] * h0.astype(jnp.float32))
    return lax.associative_scan(_combine, (decay, drive), axis=1)[1]


def read_states(h, cm):
    """``y_t = h_t . Cm_t``: ``h [B,T,E,P]``, ``cm [B,T,P]`` -> ``y [B,T,E]`` float32."""
    return jnp.einsum("BTEP,BTP->BTE", h, cm.astype(jnp.float32))


def selective_scan(u, delta, a, bm, cm, h0):
    """Parallel form: ``u, delta [B,T,E]``, ``a [E,P]``, ``bm, cm [B,T,P]``, ``h0 [B,E,P]``
    -> ``(y [B,T,E], h_T [B,E,P])``."""
    _check(u, delta, a, bm, cm, h0)
    h = selective_scan_states(u, delta, a, bm, h0)
    return read_states(h, cm).astype(u.dtype), h[:, -1]


def selective_scan_recurrent(u, delta, a, bm, cm, h0):
    """Recurrent form, one token at a time; same arguments and results as
    :func:`selective_scan`."""
    _check(u, delta, a, bm, cm, h0)
    decay, drive = _discretise(u, delta, a, bm)

    def step(h, xs):
        a_t, b_t, c_t = xs
        h = a_t * h + b_t
        return h, jnp.einsum("BEP,BP->BE", h, c_t)

    xs = (decay, drive, cm.astype(jnp.float32))
    h, y = lax.scan(step, h0.astype(jnp.float32), tuple(jnp.swapaxes(x, 0, 1) for x in xs))
    return jnp.swapaxes(y, 0, 1).astype(u.dtype), h


def causal_conv(x, kernel, bias, state):
    """Causal depthwise convolution: ``out_t = bias + sum_i kernel[i] x_{t-W+1+i}`` for
    ``x [B,T,E]``, ``kernel [W,E]``, ``bias [E]``, over the ``W-1`` inputs before ``x``
    held in ``state [B,W-1,E]`` (zeros at the start of a sequence). Returns
    ``(out [B,T,E], new state [B,W-1,E])`` (the last ``W-1`` inputs)."""
    W = kernel.shape[0]
    if state.shape != (x.shape[0], W - 1, x.shape[2]):
        raise ValueError(f"conv state must be [B,W-1,E]={(x.shape[0], W - 1, x.shape[2])}")
    T = x.shape[1]
    padded = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # [B,W-1+T,E]
    kernel = kernel.astype(x.dtype)[:, None, None, :]  # [W,1,1,E]
    out = sum(padded[:, i : i + T] * kernel[i] for i in range(W))
    return out + bias.astype(x.dtype)[None, None], padded[:, padded.shape[1] - (W - 1) :]


__all__ = [
    "causal_conv",
    "read_states",
    "selective_scan",
    "selective_scan_recurrent",
    "selective_scan_states",
]
