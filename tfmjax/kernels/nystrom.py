"""Nyström self-attention (Xiong et al. 2021, "Nyströmformer: A Nyström-Based Algorithm for
Approximating Self-Attention", AAAI), bidirectional only.

Softmax attention ``softmax(Q Kᵀ/√H) V`` is approximated through ``M`` landmarks: the means
``Q̃, K̃ [M,H]`` of the queries and keys over ``M`` segments of the sequence, and three small
softmax kernels (the paper's eq. 14)::

    F = softmax(Q K̃ᵀ/√H)    [T,M]
    A = softmax(Q̃ K̃ᵀ/√H)    [M,M]
    B = softmax(Q̃ Kᵀ/√H)    [M,S]   (padding keys masked out)
    out = F · A⁺ · (B · V)

so time and memory are ``O(T·M)`` instead of ``O(T²)``. ``A⁺`` is the paper's iterative
Moore-Penrose approximation (its eq. 15, the iteration of Razavi et al. 2014)::

    Z₀ = Aᵀ / (max_i Σ_j |A_ij| · max_j Σ_i |A_ij|)
    Z ← ¼ Z (13 I − A Z (15 I − A Z (7 I − A Z)))      (6 times)

The norms of ``Z₀`` are taken per matrix (per row and head), not over the whole batch as in
the authors' code, so rows stay independent of each other.

Landmarks and padding. The ``L_b`` real tokens of row ``b`` (``mask`` true) are split in
order into ``M`` segments as equal as can be: the ``r``-th real token belongs to segment
``floor(r·M/L_b)`` (the paper's segments when ``M`` divides ``L_b``; sizes differ by at most
one otherwise). Padding enters neither the landmarks nor the keys of ``B``, so the outputs
of real tokens are those of the row without its padding, wherever the padding sits. A
segment with no token (``L_b < M``) is an empty landmark: it is masked out of ``F`` and
``A``, and its row and column of ``A`` are zero, so ``A⁺`` is that of the real landmarks
(the iteration keeps the zero block). With ``M = L_b`` every landmark is one token and the
result is exact softmax attention (up to the convergence of ``A⁺``). Packed rows (segment
ids > 1) are not separated: train on padded batches.

Optionally (``conv_kernel``), the paper's skip path: a depthwise convolution over ``V`` along
the sequence (its ``nn.Conv2d`` with ``groups = heads``, kernel 33), added to the output.

Shapes: ``q [B,T,N,H]``, ``k, v [B,T,K,H]`` with ``K`` dividing ``N`` (GQA/MQA: each key
head serves ``G = N/K`` query heads), ``mask [B,T]``; landmarks ``M`` (and ``U``, the second
landmark axis of ``A``). Computed in float32, returned in ``q``'s dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

PINV_ITERATIONS = 6  # the paper's
# The intermediates a caller can tap (``taps`` of :func:`nystrom_attention`).
TAPS = ("landmarks_q", "landmarks_k", "kernel_f", "kernel_a", "kernel_b")


def segment_weights(mask, num_landmarks: int):
    """``[B,T,M]``: one over the segment's size where token ``t`` is a real token of
    landmark ``m``'s segment, else 0 (so ``einsum("BTM,BTKH->BMKH")`` gives the means); and
    ``[B,M]`` true where a segment holds a token."""
    mask = mask.astype(bool)
    keep = mask.astype(jnp.int32)
    rank = jnp.cumsum(keep, axis=1) - 1  # [B,T]: index among the row's real tokens
    length = jnp.maximum(jnp.sum(keep, axis=1, keepdims=True), 1)  # [B,1]
    segment = (rank * num_landmarks) // length  # [B,T]
    member = (segment[..., None] == jnp.arange(num_landmarks)[None, None, :]) & mask[..., None]
    count = jnp.sum(member, axis=1)  # [B,M]
    weights = member / jnp.maximum(count, 1)[:, None, :]
    return weights.astype(jnp.float32), count > 0


def iterative_pinv(a, iterations: int = PINV_ITERATIONS):
    """The iterative Moore-Penrose approximation of ``a [..., M, M]`` (Razavi et al. 2014,
    as in Nyströmformer's eq. 15; see the module docstring)."""
    eye = jnp.eye(a.shape[-1], dtype=a.dtype).reshape((1,) * (a.ndim - 2) + a.shape[-2:])
    rows = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)[..., None, None]
    cols = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)[..., None, None]
    z = jnp.swapaxes(a, -1, -2) / jnp.maximum(rows * cols, jnp.finfo(a.dtype).tiny)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def depthwise_conv(v, kernel, mask=None):
    """The paper's skip path: a depthwise convolution over the sequence, ``out[t,n] =
    Σ_w kernel[w,n] · v[t+w-W//2, n]`` (zeros past the ends and at padding), one kernel per
    head shared by its ``H`` features. ``v [B,T,N,H]``, ``kernel [W,N]`` (``W`` odd),
    ``mask [B,T]``; float32 in, float32 out."""
    W, T = kernel.shape[0], v.shape[1]
    if mask is not None:
        v = jnp.where(mask[:, :, None, None], v, 0.0)
    padded = jnp.pad(v, ((0, 0), (W // 2, W // 2), (0, 0), (0, 0)))
    return sum(padded[:, w : w + T] * kernel[w][None, None, :, None] for w in range(W))


def _masked_softmax(logits, keep):
    """Softmax over the last axis with ``keep`` false masked out (a row with none is
    uniform, not NaN)."""
    return jax.nn.softmax(jnp.where(keep, logits, jnp.finfo(logits.dtype).min), axis=-1)


def _tap(taps, name: str, x, heads_shape):
    """``x`` through ``taps[name]`` when there is one, seen as ``heads_shape`` (the kv head
    and group axes ``K, G`` merged into query heads ``N = K·G``: head ``n = k·G + g``)."""
    if not taps or name not in taps:
        return x
    return taps[name](x.reshape(heads_shape)).reshape(x.shape)


def _kernels(qg, k, q_land, k_land, mask, real, scale: float):
    """``F [B,K,G,T,M]``, ``A [B,K,G,M,M]`` and ``B [B,K,G,M,S]`` (module docstring)."""
    f_logits = jnp.einsum("BTKGH,BMKH->BKGTM", qg, k_land) * scale
    f = _masked_softmax(f_logits, real[:, None, None, None, :])
    a_logits = jnp.einsum("BMKGH,BUKH->BKGMU", q_land, k_land) * scale
    both = real[:, None, None, :, None] & real[:, None, None, None, :]
    a = jnp.where(both, _masked_softmax(a_logits, real[:, None, None, None, :]), 0.0)
    b_logits = jnp.einsum("BMKGH,BTKH->BKGMT", q_land, k) * scale
    b = _masked_softmax(b_logits, mask[:, None, None, None, :].astype(bool))
    return f, a, b


def nystrom_attention(
    q,
    k,
    v,
    *,
    num_landmarks: int,
    mask=None,
    scale: float | None = None,
    pinv_iterations: int = PINV_ITERATIONS,
    conv_kernel=None,
    taps: Mapping[str, Callable] | None = None,
):
    """Nyström attention ``[B,T,N,H]`` (see the module docstring). ``mask [B,T]``: real
    tokens (None: all); ``scale`` of the logits (None: ``1/√H``); ``conv_kernel [W,N]``:
    the paper's depthwise convolution over ``V`` added to the output (None: none; see
    :func:`depthwise_conv`).

    ``taps``: functions ``x -> x`` that see (and may replace) the intermediates of
    :data:`TAPS` on the way, float32: ``landmarks_q [B,M,N,H]``, ``landmarks_k [B,M,K,H]``,
    ``kernel_f [B,N,T,M]``, ``kernel_a [B,N,M,M]``, ``kernel_b [B,N,M,S]`` (the layer's hook
    points). A name without a tap costs nothing: the computation is the same without it."""
    B, T, N, H = q.shape
    K = k.shape[2]
    G = N // K
    M = num_landmarks
    scale = H**-0.5 if scale is None else scale
    if mask is None:
        mask = jnp.ones((B, T), bool)
    qg = q.astype(jnp.float32).reshape(B, T, K, G, H)
    k, v = k.astype(jnp.float32), v.astype(jnp.float32)
    weights, real = segment_weights(mask, M)  # [B,T,M], [B,M]
    q_land = jnp.einsum("BTM,BTKGH->BMKGH", weights, qg)
    q_land = _tap(taps, "landmarks_q", q_land, (B, M, N, H))
    k_land = _tap(taps, "landmarks_k", jnp.einsum("BTM,BTKH->BMKH", weights, k), (B, M, K, H))
    f, a, b = _kernels(qg, k, q_land, k_land, mask, real, scale)
    f = _tap(taps, "kernel_f", f, (B, N, T, M))
    a = _tap(taps, "kernel_a", a, (B, N, M, M))
    b = _tap(taps, "kernel_b", b, (B, N, M, T))
    bv = jnp.einsum("BKGMT,BTKH->BKGMH", b, v)
    out = f @ (iterative_pinv(a, pinv_iterations) @ bv)  # [B,K,G,T,H]
    out = jnp.einsum("BKGTH->BTKGH", out).reshape(B, T, N, H)
    if conv_kernel is not None:
        v_heads = jnp.repeat(v, G, axis=2)  # [B,T,N,H]: query head n reads key head n // G
        out = out + depthwise_conv(v_heads, conv_kernel.astype(jnp.float32), mask)
    return out.astype(q.dtype)
