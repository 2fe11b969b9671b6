"""Nyström attention (Xiong et al. 2021) against a transcription of the paper's formulas, exact
softmax attention (one token per landmark), numpy.linalg.pinv, and its padding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels.nystrom import iterative_pinv
from tfmjax.kernels.nystrom import nystrom_attention as eager_nystrom

nystrom_attention = jax.jit(eager_nystrom, static_argnames=("num_landmarks", "pinv_iterations"))


def twin(xp, q, k, v, mask, M, iterations=6, conv=None):
    """The formulas one (row, head) at a time, on the row's real tokens only (padding
    dropped, not masked): landmarks are the means of the segments ``floor(r·M/L)``, empty
    ones left out; ``F A⁺ (B V)`` with the Razavi iteration written out; ``conv [W,N]``: plus
    ``Σ_w conv[w,n] V[r+w-W//2]`` over the real tokens. ``xp`` is numpy or jax.numpy.
    Returns ``{(b, n): [L_b,H]}``."""
    B, T, N, H = q.shape
    G = N // k.shape[2]

    def softmax(x):
        e = xp.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    out = {}
    for b in range(B):
        idx = np.nonzero(np.asarray(mask[b]))[0]
        L = len(idx)
        for n in range(N):
            qb, kb, vb = q[b][idx][:, n], k[b][idx][:, n // G], v[b][idx][:, n // G]
            segments = [[r for r in range(L) if r * M // L == j] for j in range(M)]
            segments = [s for s in segments if s]
            q_land = xp.stack([qb[np.array(s)].mean(axis=0) for s in segments])
            k_land = xp.stack([kb[np.array(s)].mean(axis=0) for s in segments])
            f = softmax(qb @ k_land.T / np.sqrt(H))
            a = softmax(q_land @ k_land.T / np.sqrt(H))
            bm = softmax(q_land @ kb.T / np.sqrt(H))
            z = a.T / (xp.abs(a).sum(axis=1).max() * xp.abs(a).sum(axis=0).max())
            eye = np.eye(len(segments))
            for _ in range(iterations):
                az = a @ z
                z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
            out[b, n] = f @ (z @ (bm @ vb))
            if conv is not None:  # vp[r + w] = V[r + w - W//2], zeros past the ends
                W = conv.shape[0]
                zeros = np.zeros((W // 2, H), vb.dtype)
                vp = xp.concatenate([zeros, vb, zeros])
                out[b, n] = out[b, n] + sum(conv[w, n] * vp[w : w + L] for w in range(W))
    return out


def inputs(B=2, T=11, N=4, K=2, H=8, seed=0, lengths=(11, 7)):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(B, T, n, H)).astype(np.float32) for n in (N, K, K))
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    return q, k, v, mask


def gather(out, mask):
    """The kernel's real positions ``{(b, n): [L_b,H]}``, as the twin gives them."""
    out = np.asarray(out)
    return {
        (b, n): out[b, np.asarray(mask[b])][:, n]
        for b in range(out.shape[0])
        for n in range(out.shape[2])
    }


CONV = np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)  # W = 3, N = 4


@pytest.mark.parametrize(
    "M, conv", [(3, None), (4, None), (8, None), (4, CONV)]
)  # T = 11 and 7 real tokens: uneven and empty segments; the skip convolution
def test_values_match_the_numpy_transcription(M, conv):
    q, k, v, mask = inputs()
    out = nystrom_attention(q, k, v, num_landmarks=M, mask=mask, conv_kernel=conv)
    got = gather(out, mask)
    f64 = [a.astype(np.float64) for a in (q, k, v)]
    want = twin(np, *f64, mask, M, conv=None if conv is None else conv.astype(np.float64))
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-4)


def test_gradients_match_the_jnp_twin():
    """With respect to q, k, v and the skip convolution's kernel."""
    q, k, v, mask = inputs(N=2, K=1, T=9, lengths=(9, 6))
    w = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)
    conv = CONV[:, :2]

    def kernel_loss(q, k, v, conv):
        out = nystrom_attention(q, k, v, num_landmarks=4, mask=mask, conv_kernel=conv)
        return jnp.sum(out * w * mask[:, :, None, None])

    def twin_loss(q, k, v, conv):
        out = twin(jnp, q, k, v, mask, 4, conv=conv)
        return sum(jnp.sum(o * w[b, np.asarray(mask[b])][:, n]) for (b, n), o in out.items())

    got = jax.jit(jax.grad(kernel_loss, argnums=(0, 1, 2, 3)))(q, k, v, conv)
    want = jax.jit(jax.grad(twin_loss, argnums=(0, 1, 2, 3)))(q, k, v, conv)
    for g, t in zip(got, want, strict=True):
        np.testing.assert_allclose(g, t, rtol=1e-3, atol=1e-4)


def exact_softmax(q, k, v):
    G = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    logits = np.einsum("BTNH,BSNH->BNTS", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("BNTS,BSNH->BTNH", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("iterations, tol", [(6, 3e-2), (30, 2e-4)])
def test_one_token_per_landmark_is_exact_softmax_attention(iterations, tol):
    """With ``M = T`` each landmark is a token, so ``F = A = B`` is softmax's matrix ``P`` and
    ``P P⁺ P V = P V``; six iterations leave ``A⁺`` a few percent off on these (condition
    numbers up to ~100), thirty converge."""
    q, k, v, _ = inputs(T=8, lengths=(8, 8))
    out = nystrom_attention(q, k, v, num_landmarks=8, pinv_iterations=iterations)
    np.testing.assert_allclose(out, exact_softmax(q, k, v), atol=tol)


def test_iterative_pinv_approaches_numpy_pinv():
    """A well-conditioned row-stochastic ``A`` (softmax of a diagonally dominant matrix):
    the error to ``numpy.linalg.pinv`` falls fast (0.8, 0.3, 1e-2, 6e-7 after 0..3
    iterations) and stays at float32's rounding through the paper's six."""
    rng = np.random.default_rng(0)
    a = jax.nn.softmax(4 * np.eye(6) + rng.normal(size=(2, 6, 6)), axis=-1)
    want = np.linalg.pinv(np.asarray(a, np.float64))
    pinv = jax.jit(iterative_pinv, static_argnums=1)
    errors = [float(np.max(np.abs(pinv(a, i) - want))) for i in range(7)]
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert max(errors[3:]) < 1e-5


def test_padding_never_changes_real_outputs():
    """A row padded on the right, or on both sides, with any content gives its real tokens
    the outputs of the unpadded row."""
    q, k, v, _ = inputs(B=1, T=7, lengths=(7,))
    plain = np.asarray(nystrom_attention(q, k, v, num_landmarks=3))
    rng = np.random.default_rng(5)
    for left, right in ((0, 5), (2, 3)):
        pad = [(0, 0), (left, right), (0, 0), (0, 0)]
        qp, kp, vp = (
            np.pad(a, pad)
            + np.pad(0 * a, pad, constant_values=1)
            * rng.normal(size=np.pad(a, pad).shape).astype(np.float32)
            for a in (q, k, v)
        )
        mask = np.pad(np.ones((1, 7), bool), [(0, 0), (left, right)])
        out = nystrom_attention(qp, kp, vp, num_landmarks=3, mask=mask)
        np.testing.assert_allclose(np.asarray(out)[:, left : left + 7], plain, atol=1e-5)


def test_dtype_and_shapes():
    q, k, v, mask = inputs(N=4, K=1)  # MQA
    out = nystrom_attention(*(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)), num_landmarks=4)
    assert out.shape == q.shape and out.dtype == jnp.bfloat16
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))


def test_empty_landmarks_and_empty_rows_stay_finite():
    """Rows with fewer real tokens than landmarks (3 < 5) or none at all: values and
    gradients (through the masked softmaxes and the pseudo-inverse's zero block) are finite."""
    q, k, v, mask = inputs(B=3, T=8, N=2, K=1, H=4, lengths=(8, 3, 0))
    conv = CONV[:, :2]

    def loss(q, k, v, conv):
        out = nystrom_attention(q, k, v, num_landmarks=5, mask=mask, conv_kernel=conv)
        return jnp.sum(out**2)

    assert np.isfinite(float(loss(q, k, v, conv)))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, conv)
    assert all(bool(np.all(np.isfinite(g))) for g in grads)
