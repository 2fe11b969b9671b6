"""Blockwise attention in pure JAX: online softmax over key blocks (FlashAttention, Dao 2022).

Queries are cut into blocks of ``block_q`` rows and keys into blocks of ``block_k``
columns. For each query block a loop over key blocks keeps the running row maximum
``m``, the running denominator ``l`` and the unnormalised output ``O`` (the online
softmax recurrence), so no ``T x S`` array ever exists. The result is exact. This module
is the entry point and the ``custom_vjp``; the parts live in sibling modules:

* **Block skipping** (:mod:`tfmjax.kernels.block_geometry`, shared with the Pallas
  kernels). Causal masks and sliding windows bound the distance ``d = p - s`` between a
  query position ``p`` and a key position ``s``; ``block_range`` turns that into the range
  of key blocks a query block needs, and the sub-range it sees entirely. The inner loop
  runs only over the needed range (its bounds are traced scalars, so a traced ``q_offset``
  skips too), and only blocks on the edge of the range pay for building and applying a
  mask. ``pattern_ranges`` adds the sparse patterns of :mod:`tfmjax.kernels.masks`
  (``stride``, Child et al. 2019; ``global_tokens``, Beltagy et al. 2020).
* **Layout** (:mod:`tfmjax.kernels.blockwise_layout`): :class:`BlockSizes`, the static
  options of a call, the regrouping into (batch x key/value head) groups, one block's scores.
* **Forward** (:mod:`tfmjax.kernels.blockwise_forward`): saves only ``O`` and the row
  log-sum-exp ``lse = m + log l``.
* **Backward** (:mod:`tfmjax.kernels.blockwise_backward`): ``jax.custom_vjp``; recomputes
  ``P = exp(S - lse)`` block by block (FlashAttention-2), in one pass: outer loop over query
  blocks carrying ``dK, dV`` for the whole key length, inner loop over the needed key blocks
  carrying the block's ``dQ``. Five matmuls per block pair; residuals are O(T).
* **GQA / MQA.** The ``G = N / K`` query heads that share a key/value head form one
  group and share its matmuls (``GTH,SH->GTS``): K and V are never repeated. Groups
  (batch x key/value heads) are processed ``kv_heads_per_step`` at a time, so a score
  block ``[G, bq, bk]`` stays in cache through the passes XLA makes over it.
* **Masks and ALiBi** are built per block by :func:`tfmjax.kernels.masks.allowed`
  and :func:`tfmjax.kernels.masks.alibi_bias` from that block's positions.
* **Ragged lengths.** ``T`` and ``S`` are padded up to the block sizes; padded keys
  are masked, padded queries dropped.

ALiBi slopes, segment ids and ``q_offset`` are treated as constants: they get no
gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tfmjax.kernels.blockwise_backward import backward
from tfmjax.kernels.blockwise_forward import forward
from tfmjax.kernels.blockwise_layout import BlockSizes, BlockwiseStatic


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st, q, k, v, q_seg, kv_seg, slopes, offset):
    return forward(st, q, k, v, q_seg, kv_seg, slopes, offset)[0]


def _attention_fwd(st, q, k, v, q_seg, kv_seg, slopes, offset):
    out, lse = forward(st, q, k, v, q_seg, kv_seg, slopes, offset)
    return out, (q, k, v, q_seg, kv_seg, slopes, offset, out, lse)


def _attention_bwd(st, res, d_out):
    slopes = res[5]  # slopes, segment ids and offset are constants: no gradient
    return (
        *backward(st, res, d_out),
        None,
        None,
        None if slopes is None else jnp.zeros_like(slopes),
        None,
    )


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(
    q,
    k,
    v,
    *,
    causal,
    q_segment_ids,
    kv_segment_ids,
    window,
    alibi_slopes,
    bias,
    q_offset,
    scale,
    stride: int | None = None,
    global_tokens: int = 0,
    random_blocks=None,
    block_sizes: BlockSizes | None = None,
):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]``; see the module docstring (mask
    options as in :mod:`tfmjax.kernels.masks`).

    ``q_offset`` may be a traced int32 scalar (decoding); block skipping still applies.
    """
    if bias is not None:
        raise ValueError(
            "impl='blockwise' takes structured masks only; a dense bias needs "
            "impl='xla' or 'reference'"
        )
    st = BlockwiseStatic(
        causal=bool(causal),
        window=None if window is None else int(window),
        scale=float(scale),
        q_len=q.shape[1],
        kv_len=k.shape[1],
        blocks=block_sizes or BlockSizes(),  # looked up here at call time: tests swap it
        stride=None if stride is None else int(stride),
        global_tokens=int(global_tokens),
        random_blocks=random_blocks,
    )
    if q_segment_ids is not None:
        q_segment_ids = q_segment_ids.astype(jnp.int32)
        kv_segment_ids = kv_segment_ids.astype(jnp.int32)
    offset = jnp.asarray(q_offset, jnp.int32)
    return _attention(st, q, k, v, q_segment_ids, kv_segment_ids, alibi_slopes, offset)
