"""Retention (Sun et al. 2023, "Retentive Network: A Successor to Transformer for Large
Language Models"), its three equivalent forms.

Per head ``n`` with decay ``gamma_n`` (:func:`retention_decays`: ``1 - 2^(-5-n)``), queries
``q [B,T,N,H]``, keys ``k [B,T,N,H]`` and values ``v [B,T,N,J]`` (``J``: the value width),
the output of position ``t`` is

    o_t = sum_{s <= t} gamma^(t-s) (q_t . k_s) v_s                       (parallel, eq. 5)
        = q_t S_t,   S_t = gamma S_{t-1} + k_t^T v_t,   S_0 = 0          (recurrent, eq. 6)

and the chunkwise form (eq. 7) splits the sequence into chunks of ``C``: inside a chunk the
parallel form, across chunks the state ``S [B,N,H,J]`` carried by a ``lax.scan``.

* :func:`retention_parallel`: ``(Q K^T * D) V`` with the decay mask ``D [N,T,T]``
  (``gamma^(t-s)`` for ``t >= s``, else 0): O(T^2), the training form.
* :func:`retention_recurrent`: one token at a time (``lax.scan``), from a carried state.
* :func:`retention_chunkwise`: chunk by chunk from a carried state: O(T C) time and the
  decoding path (prefill and one-token steps alike).

The parallel form's parts, for the hook points of :mod:`tfmjax.layers.retention`:
:func:`retention_scores` (the decayed scores ``[B,N,T,S]``), :func:`retention_from_scores`
(their product with ``v``) and :func:`retention_state` (the state after the sequence).

This is the xPos-free variant: positions enter only through the decay (and, when the model
uses it, RoPE applied to ``q`` and ``k`` by the caller: RetNet's rotation ``e^{i n theta}``
without xPos' extra scaling). The paper's score normalisations (dividing ``D`` by its row
sums' square root and the scores by their absolute row sums) only rescale each output row
and are undone by the per-head GroupNorm that follows, so they are left out. ``kv_mask
[B,T]`` (0 = padding) zeroes those keys: padding never enters a state. Every sum is float32;
outputs have q's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def retention_decays(num_heads: int) -> np.ndarray:
    """``log gamma [N]`` with ``gamma_n = 1 - 2^(-5-n)`` (Sun et al. 2023, Sec. 2.2), float64."""
    return np.log1p(-(2.0 ** (-5.0 - np.arange(num_heads))))


def _check(q, k, v, log_gamma, kv_mask):
    if q.ndim != 4 or q.shape != k.shape or v.ndim != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"want q, k [B,T,N,H] and v [B,T,N,J]; got {q.shape}, {k.shape}, {v.shape}"
        )
    if np.shape(log_gamma) != (q.shape[2],):
        raise ValueError(f"log_gamma must be [N={q.shape[2]}], got {np.shape(log_gamma)}")
    if kv_mask is not None and kv_mask.shape != q.shape[:2]:
        raise ValueError(f"kv_mask must be [B,T]={q.shape[:2]}, got {kv_mask.shape}")


def _prepare(q, k, v, kv_mask):
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    if kv_mask is not None:
        k = k * (kv_mask != 0)[:, :, None, None].astype(jnp.float32)
    return q, k, v


def decay_mask(log_gamma, length: int):
    """``D [N,T,T]``: ``gamma_n^(t-s)`` for ``t >= s``, 0 above the diagonal (float32)."""
    t = jnp.arange(length)
    dist = (t[:, None] - t[None, :]).astype(jnp.float32)[None]  # [1,T,T]
    lg = jnp.asarray(log_gamma, jnp.float32)[:, None, None]
    # exp(-inf) = 0 above the diagonal: no overflow, no NaN gradient.
    return jnp.exp(jnp.where(dist >= 0, dist * lg, -jnp.inf))


def retention_scores(q, k, log_gamma, *, kv_mask=None):
    """The decayed scores ``(Q K^T) * D`` ``[B,N,T,S]`` (float32) of the parallel form:
    ``gamma_n^(t-s) (q_t . k_s)`` for ``s <= t``, 0 above the diagonal and at padding keys."""
    _check(q, k, k, log_gamma, kv_mask)
    q, k, _ = _prepare(q, k, k, kv_mask)
    return jnp.einsum("BTNH,BSNH->BNTS", q, k) * decay_mask(log_gamma, q.shape[1])[None]


def retention_from_scores(scores, v):
    """``scores [B,N,T,S] @ v [B,S,N,J]`` -> ``[B,T,N,J]`` float32: the parallel form's
    output from its (possibly edited) decayed scores."""
    return jnp.einsum("BNTS,BSNJ->BTNJ", scores, v.astype(jnp.float32))


def retention_parallel(q, k, v, log_gamma, *, kv_mask=None):
    """The parallel form ``(Q K^T * D) V``: ``q, k [B,T,N,H]``, ``v [B,T,N,J]`` ->
    ``[B,T,N,J]``."""
    _check(q, k, v, log_gamma, kv_mask)
    scores = retention_scores(q, k, log_gamma, kv_mask=kv_mask)
    return retention_from_scores(scores, v).astype(q.dtype)


def _decayed_sum(k, v, lg):
    """``sum_s gamma^(C-1-s) k_s^T v_s`` ``[B,N,H,J]`` over a chunk ``k [B,C,N,H]``, ``v
    [B,C,N,J]`` (float32; ``lg`` float32 ``[N]``)."""
    steps = jnp.arange(k.shape[1], dtype=jnp.float32)
    left = jnp.exp((k.shape[1] - 1.0 - steps)[:, None] * lg[None, :])  # [C,N]
    return jnp.einsum("BSNH,BSNJ->BNHJ", k * left[None, :, :, None], v)


def retention_state(k, v, log_gamma, *, kv_mask=None):
    """The state after the whole sequence from an empty one, ``S_T = sum_s gamma^(T-1-s)
    k_s^T v_s`` ``[B,N,H,J]`` (float32): what the recurrent and chunkwise forms carry on
    from (padding keys left out)."""
    _check(k, k, v, log_gamma, kv_mask)
    _, k, v = _prepare(k, k, v, kv_mask)
    return _decayed_sum(k, v, jnp.asarray(log_gamma, jnp.float32))


def init_retention_state(batch: int, num_heads: int, key_dim: int, value_dim: int):
    """The empty state ``S [B,N,H,J]`` (float32 zeros)."""
    return jnp.zeros((batch, num_heads, key_dim, value_dim), jnp.float32)


def _check_state(state, q, v):
    want = (q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    if tuple(state.shape) != want:
        raise ValueError(f"state must be [B,N,H,J]={want}, got {tuple(state.shape)}")


def retention_recurrent(state, q, k, v, log_gamma, *, kv_mask=None):
    """The recurrent form, one token at a time from ``state [B,N,H,J]``: returns
    ``(out [B,T,N,J], new state)``."""
    _check(q, k, v, log_gamma, kv_mask)
    _check_state(state, q, v)
    dtype = q.dtype
    q, k, v = _prepare(q, k, v, kv_mask)
    gamma = jnp.exp(jnp.asarray(log_gamma, jnp.float32))[None, :, None, None]

    def step(s, xs):
        qt, kt, vt = xs  # [B,N,H], [B,N,H], [B,N,J]
        s = gamma * s + jnp.einsum("BNH,BNJ->BNHJ", kt, vt)
        return s, jnp.einsum("BNH,BNHJ->BNJ", qt, s)

    state, out = lax.scan(
        step, state.astype(jnp.float32), tuple(jnp.swapaxes(x, 0, 1) for x in (q, k, v))
    )
    return jnp.swapaxes(out, 0, 1).astype(dtype), state


def _chunk(log_gamma, state, xs):
    """One chunk ``q, k [B,C,N,H]``, ``v [B,C,N,J]`` from the state of everything before."""
    q, k, v = xs
    C = q.shape[1]
    lg = jnp.asarray(log_gamma, jnp.float32)
    steps = jnp.arange(C, dtype=jnp.float32)
    inner = jnp.einsum("BTNH,BSNH->BNTS", q, k) * decay_mask(lg, C)[None]
    out = jnp.einsum("BNTS,BSNJ->BTNJ", inner, v)
    # Earlier chunks: q_t S gamma^(t+1).
    into = jnp.exp((steps[:, None] + 1.0) * lg[None, :])  # [C,N]
    out = out + jnp.einsum("BTNH,BNHJ->BTNJ", q, state) * into[None, :, :, None]
    # S_new = gamma^C S + sum_s gamma^(C-1-s) k_s^T v_s.
    state = jnp.exp(C * lg)[None, :, None, None] * state + _decayed_sum(k, v, lg)
    return state, out


def retention_chunkwise(state, q, k, v, log_gamma, *, kv_mask=None, chunk_size: int = 64):
    """The chunkwise form from ``state [B,N,H,J]``: returns ``(out [B,T,N,J], new state)``.
    Whole chunks of ``chunk_size`` go through a ``lax.scan``; a remainder is one more chunk."""
    _check(q, k, v, log_gamma, kv_mask)
    _check_state(state, q, v)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
    dtype = q.dtype
    q, k, v = _prepare(q, k, v, kv_mask)
    B, T = q.shape[:2]
    C = min(chunk_size, T)
    whole = (T // C) * C
    state = state.astype(jnp.float32)
    body = jax.checkpoint(lambda s, xs: _chunk(log_gamma, s, xs))

    def chunks(x):  # [B,whole,...] -> [whole/C,B,C,...]
        return jnp.moveaxis(x[:, :whole].reshape(B, whole // C, C, *x.shape[2:]), 1, 0)

    state, out = lax.scan(body, state, tuple(chunks(x) for x in (q, k, v)))
    out = jnp.moveaxis(out, 0, 1).reshape(B, whole, *out.shape[3:])
    if whole < T:
        state, rest = _chunk(log_gamma, state, (q[:, whole:], k[:, whole:], v[:, whole:]))
        out = jnp.concatenate([out, rest], axis=1)
    return out.astype(dtype), state


__all__ = [
    "decay_mask",
    "init_retention_state",
    "retention_chunkwise",
    "retention_decays",
    "retention_from_scores",
    "retention_parallel",
    "retention_recurrent",
    "retention_scores",
    "retention_state",
]
