"""Helpers to check an attention implementation against ``reference``: random inputs, the
jitted ``(out, dq, dk, dv)`` of an implementation, and a tolerance check per dtype.

Used by ``tests/kernels``; handy for anyone adding an implementation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Max abs error allowed: (output, gradients) per input dtype.
TOLERANCE = {jnp.float32: (2e-5, 1e-4), jnp.bfloat16: (2e-2, 5e-2)}

# Segment layouts ``(causal, q runs, kv runs)`` for B=2, T=13, S=21: one list of
# ``(segment id, run length)`` per row (see :func:`segment_ids`).
SEGMENT_CASES = {
    # Right padding (id 0) in both, different lengths per row.
    "padding": (False, [[(1, 10), (0, 3)], [(1, 13)]], [[(1, 15), (0, 6)], [(1, 21)]]),
    # Packing: several documents per row, left padding in the keys.
    "packing_causal": (
        True,
        [[(1, 4), (2, 6), (3, 3)], [(5, 7), (6, 6)]],
        [[(1, 7), (2, 9), (3, 5)], [(0, 3), (5, 10), (6, 8)]],
    ),
}


def random_inputs(B, T, S, N, K, H, dtype, seed=0):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` and a cotangent ``d_out [B,T,N,H]``."""
    ks = jax.random.split(jax.random.key(seed), 4)
    shapes = ((B, T, N, H), (B, S, K, H), (B, S, K, H), (B, T, N, H))
    return [
        jax.random.normal(key, shape, jnp.float32).astype(dtype)
        for key, shape in zip(ks, shapes, strict=True)
    ]


def call_kwargs(H, **kw):
    """Every keyword of an implementation's ``attention``, defaults overridden by ``kw``."""
    return dict(
        dict(
            causal=False,
            q_segment_ids=None,
            kv_segment_ids=None,
            window=None,
            alibi_slopes=None,
            bias=None,
            q_offset=0,
            scale=H**-0.5,
        ),
        **kw,
    )


def value_and_grads(fn, q, k, v, d_out, **kw):
    """Jitted ``(out, dq, dk, dv)`` of ``fn(q, k, v, **kw)`` for the cotangent ``d_out``."""

    def run(q, k, v, d_out):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **kw), q, k, v)
        return (out, *vjp(d_out))

    return jax.jit(run)(q, k, v, d_out)


def assert_close(got, want, dtype):
    """``got`` and ``want`` (``(out, dq, dk, dv)``) agree within :data:`TOLERANCE`."""
    tol_out, tol_grad = TOLERANCE[dtype]
    tols = (tol_out,) + (tol_grad,) * 3
    for name, g, w, tol in zip(("out", "dq", "dk", "dv"), got, want, tols, strict=True):
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        assert np.all(np.isfinite(g)), f"{name} has non-finite values"
        err = np.max(np.abs(g - w))
        assert err <= tol, f"{name}: max abs error {err:.2e} > {tol:.0e}"


def segment_ids(L, spec):
    """``[B, L]`` segment ids from one list of ``(id, run length)`` per row."""
    ids = np.zeros((len(spec), L), np.int32)
    for b, runs in enumerate(spec):
        pos = 0
        for seg, n in runs:
            ids[b, pos : pos + n] = seg
            pos += n
    return jnp.asarray(ids)
