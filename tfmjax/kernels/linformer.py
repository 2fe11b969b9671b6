"""Linformer self-attention (Wang et al. 2020, "Linformer: Self-Attention with Linear
Complexity"), bidirectional only and fixed-length.

Keys and values are projected along the sequence axis to ``R`` rows (the paper's ``k``) by
learned matrices ``E, F [R,T_max]``, and the ``T`` queries attend to those ``R`` rows with
ordinary softmax attention (the paper's eq. 7)::

    K̄ = E K      [R,H]      V̄ = F V      [R,H]
    P = softmax(Q K̄ᵀ/√H)    [T,R]
    out = P V̄               [T,H]

so time and memory are ``O(T·R)`` instead of ``O(T²)``. ``E`` and ``F`` are shared by all
heads of a layer (the paper's headwise sharing); passing the same matrix twice is its
key-value sharing (``E = F``).

Length and padding. The projection is over positions: a row of length ``T < T_max`` uses
the first ``T`` columns of ``E`` and ``F`` (position ``t`` always meets column ``t``).
Padding positions (``mask`` false) are zeroed in ``K`` and ``V`` before the projection, so
they contribute nothing: the values at padding positions change no real token's output, and
neither does more right padding (its columns multiply zeros). Moving a real token to another
position does change it (it meets another column): left padding is not the same row. Packed
rows (segment ids > 1) are not separated: train on padded batches. With ``R = T`` and
``E = F = I`` the result is exact softmax attention over all ``T`` keys.

Shapes: ``q [B,T,N,H]``, ``k, v [B,T,K,H]`` with ``K`` dividing ``N`` (GQA/MQA: each key
head serves ``G = N/K`` query heads), ``mask [B,T]``, ``e, f [R,T_max]`` with ``T <= T_max``.
Computed in float32, returned in ``q``'s dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

# The intermediates a caller can tap (``taps`` of :func:`linformer_attention`).
TAPS = ("k_proj", "v_proj", "pattern")


def project(k, e, mask=None):
    """``E K``: ``k [B,T,K,H]`` projected along the sequence by the first ``T`` columns of
    ``e [R,T_max]``, padding (``mask [B,T]`` false) zeroed first -> ``[B,R,K,H]`` (float32)."""
    T = k.shape[1]
    if T > e.shape[1]:
        raise ValueError(f"linformer: a row of {T} positions exceeds the projection's {e.shape[1]}")
    k = k.astype(jnp.float32)
    if mask is not None:
        k = jnp.where(mask[:, :, None, None], k, 0.0)
    return jnp.einsum("RT,BTKH->BRKH", e[:, :T].astype(jnp.float32), k)


def _tap(taps, name: str, x, heads_shape):
    """``x`` through ``taps[name]`` when there is one, seen as ``heads_shape`` (the kv head
    and group axes ``K, G`` merged into query heads ``N = K·G``: head ``n = k·G + g``)."""
    if not taps or name not in taps:
        return x
    return taps[name](x.reshape(heads_shape)).reshape(x.shape)


def linformer_attention(
    q,
    k,
    v,
    e,
    f,
    *,
    mask=None,
    scale: float | None = None,
    taps: Mapping[str, Callable] | None = None,
):
    """Linformer attention ``[B,T,N,H]`` (see the module docstring). ``e, f [R,T_max]``:
    the key and value projections; ``mask [B,T]``: real tokens (None: all); ``scale`` of
    the logits (None: ``1/√H``).

    ``taps``: functions ``x -> x`` that see (and may replace) the intermediates of
    :data:`TAPS` on the way, float32: ``k_proj [B,R,K,H]``, ``v_proj [B,R,K,H]``,
    ``pattern [B,N,T,R]`` (the layer's hook points). A name without a tap costs nothing."""
    B, T, N, H = q.shape
    K = k.shape[2]
    G = N // K
    R = e.shape[0]
    scale = H**-0.5 if scale is None else scale
    k_proj = _tap(taps, "k_proj", project(k, e, mask), (B, R, K, H))
    v_proj = _tap(taps, "v_proj", project(v, f, mask), (B, R, K, H))
    qg = q.astype(jnp.float32).reshape(B, T, K, G, H)
    logits = jnp.einsum("BTKGH,BRKH->BKGTR", qg, k_proj) * scale
    pattern = _tap(taps, "pattern", jax.nn.softmax(logits, axis=-1), (B, N, T, R))
    out = jnp.einsum("BKGTR,BRKH->BTKGH", pattern, v_proj).reshape(B, T, N, H)
    return out.astype(q.dtype)
