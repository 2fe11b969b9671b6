"""Linformer attention (Wang et al. 2020) against a NumPy float64 transcription of the paper's
formula and of its gradients, exact softmax attention (``R = T``, ``E = F = I``), and its
padding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels import reference
from tfmjax.kernels.linformer import linformer_attention as eager_linformer

linformer_attention = jax.jit(eager_linformer)


def inputs(B=2, T=7, N=4, K=2, H=8, R=3, T_max=9, seed=0, lengths=(7, 5)):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(B, T, n, H)).astype(np.float32) for n in (N, K, K))
    e, f = (rng.normal(size=(R, T_max)).astype(np.float32) / np.sqrt(R) for _ in range(2))
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    return q, k, v, e, f, mask


def twin(q, k, v, e, f, mask, d_out=None):
    """The paper's ``softmax(Q (E K)ᵀ/√H) (F V)`` one (row, head) at a time in float64, with
    padding zeroed in K and V and the first T columns of E and F; with ``d_out [B,T,N,H]``
    also the hand-written backward: ``(out, (dq, dk, dv, de, df))``."""
    q, k, v, e, f = (np.asarray(a, np.float64) for a in (q, k, v, e, f))
    B, T, N, H = q.shape
    G = N // k.shape[2]
    s = 1 / np.sqrt(H)
    E, F = e[:, :T], f[:, :T]
    keep = np.asarray(mask, np.float64)[:, :, None]
    out = np.zeros_like(q)
    grads = [np.zeros_like(a) for a in (q, k, v, e, f)]
    for b in range(B):
        for n in range(N):
            km, vm = k[b, :, n // G] * keep[b], v[b, :, n // G] * keep[b]
            kp, vp = E @ km, F @ vm  # [R,H]
            logits = q[b, :, n] @ kp.T * s
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)  # [T,R]
            out[b, :, n] = p @ vp
            if d_out is None:
                continue
            do = np.asarray(d_out, np.float64)[b, :, n]
            dp = do @ vp.T
            dlogits = p * (dp - (dp * p).sum(axis=1, keepdims=True)) * s
            dkp, dvp = dlogits.T @ q[b, :, n], p.T @ do
            grads[0][b, :, n] = dlogits @ kp
            grads[1][b, :, n // G] += (E.T @ dkp) * keep[b]
            grads[2][b, :, n // G] += (F.T @ dvp) * keep[b]
            grads[3][:, :T] += dkp @ km.T
            grads[4][:, :T] += dvp @ vm.T
    return out, tuple(grads)


def test_values_match_the_float64_transcription():
    q, k, v, e, f, mask = inputs()
    got = linformer_attention(q, k, v, e, f, mask=mask)
    want, _ = twin(q, k, v, e, f, mask)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_match_the_float64_transcription():
    """With respect to q, k, v, E and F (E's and F's columns past T get zero)."""
    q, k, v, e, f, mask = inputs()
    w = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)
    loss = lambda *a: jnp.sum(eager_linformer(*a, mask=mask) * w)  # noqa: E731
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, e, f)
    _, want = twin(q, k, v, e, f, mask, d_out=w)
    for g, t in zip(got, want, strict=True):
        np.testing.assert_allclose(g, t, rtol=1e-4, atol=1e-5)


def test_full_rank_identity_projections_are_exact_softmax_attention():
    q, k, v, _, _, _ = inputs(T=6, lengths=(6, 6))
    eye = np.eye(6, 9, dtype=np.float32)  # R = T = 6 of T_max = 9: the first T columns are I
    got = linformer_attention(q, k, v, eye, eye)
    want = reference.attention(
        q,
        k,
        v,
        causal=False,
        q_segment_ids=None,
        kv_segment_ids=None,
        window=None,
        alibi_slopes=None,
        bias=None,
        q_offset=0,
        scale=8**-0.5,
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_padding_contributes_nothing():
    """Changing k and v at padding positions, or padding the row further on the right,
    changes no real token's output (a real token at position t always meets column t)."""
    q, k, v, e, f, mask = inputs()
    rng = np.random.default_rng(2)
    k2, v2 = (np.where(mask[:, :, None, None], a, 100 * rng.normal(size=a.shape)) for a in (k, v))
    real = mask[:, :, None, None]
    base = linformer_attention(q, k, v, e, f, mask=mask)
    np.testing.assert_array_equal(
        np.where(real, linformer_attention(q, k2, v2, e, f, mask=mask), 0),
        np.where(real, base, 0),
    )
    wide = [np.pad(a, ((0, 0), (0, 2), (0, 0), (0, 0)), constant_values=5.0) for a in (q, k, v)]
    wide_mask = np.pad(mask, ((0, 0), (0, 2)))
    out = linformer_attention(*wide, e, f, mask=wide_mask)[:, :7]
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, base, 0), atol=1e-6)


def test_taps_see_the_projections_and_the_pattern():
    q, k, v, e, f, mask = inputs()
    seen = {}
    taps = {n: functools.partial(seen.setdefault, n) for n in ("k_proj", "v_proj", "pattern")}
    eager_linformer(q, k, v, e, f, mask=mask, taps=taps)
    assert seen["k_proj"].shape == seen["v_proj"].shape == (2, 3, 2, 8)
    assert seen["pattern"].shape == (2, 4, 7, 3)
    np.testing.assert_allclose(np.sum(seen["pattern"], axis=-1), 1.0, rtol=1e-6)
    # An edit flows on: a uniform pattern gives each query the mean of the projected values.
    taps = {"pattern": lambda p: jnp.full_like(p, 1 / 3)}
    out = eager_linformer(q, k, v, e, f, mask=mask, taps=taps)
    mean_v = jnp.repeat(seen["v_proj"].mean(axis=1), 2, axis=1)  # [B,N,H]
    np.testing.assert_allclose(out, jnp.broadcast_to(mean_v[:, None], out.shape), rtol=1e-5)
