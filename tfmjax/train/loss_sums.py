"""The float32 sums a train or eval step reports, from whole logits or chunk by chunk.

:func:`batch_sums` takes logits ``[B,T,V]``. :func:`chunked_batch_sums` takes the output
head's inputs ``[B,T,D]`` and the head's projection, and forms the logits of ``C`` positions
at a time inside a ``lax.scan`` whose body is rematerialised (``jax.checkpoint``): the
backward pass recomputes each chunk's logits, so no float32 ``[B,T,V]`` array (the largest
of a GPT-2 step: 8 x 1024 x 50,257 x 4 bytes = 1.6 GB, with its softmax and gradient beside
it) is ever held. The sums are the same up to float32 summation order.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from tfmjax.losses import cross_entropy, sequence_exact_match, token_accuracy

TOKEN_SUMS = ("loss_sum", "nll_sum", "tokens", "correct")


def token_sums(logits, targets, mask, label_smoothing) -> dict:
    """Smoothed loss, NLL, tokens and correct tokens of logits ``[B,T,V]``: float32 sums.
    ``label_smoothing`` may be a traced per-run array (:mod:`tfmjax.train.stacked`): where it
    is 0 the NLL is then the loss sum itself, as for a Python 0."""
    loss_sum, tokens = cross_entropy(logits, targets, mask, label_smoothing)
    if isinstance(label_smoothing, jax.Array):
        nll = cross_entropy(logits, targets, mask)[0]
        nll_sum = jnp.where(label_smoothing > 0, nll, loss_sum)
    else:
        nll_sum = cross_entropy(logits, targets, mask)[0] if label_smoothing else loss_sum
    correct, _ = token_accuracy(logits, targets, mask)
    return {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens, "correct": correct}


def batch_sums(logits, targets, mask, label_smoothing) -> dict:
    """:func:`token_sums` plus exact sequences and sequences, of logits ``[B,T,V]``."""
    exact, sequences = sequence_exact_match(logits, targets, mask)
    return {
        **token_sums(logits, targets, mask, label_smoothing),
        "exact": exact.astype(jnp.float32),
        "sequences": sequences.astype(jnp.float32),
    }


def chunked_batch_sums(
    head_inputs, project: Callable, targets, mask, label_smoothing, chunk: int
) -> dict:
    """:func:`batch_sums` of ``project(head_inputs)``, ``chunk`` positions at a time.

    ``head_inputs [B,T,D]``; ``project``: ``[B,C,D] -> float32 logits [B,C,V]``; targets,
    mask ``[B,T]``. T is padded up to a multiple of ``chunk`` with masked-out positions."""
    B, T, _ = head_inputs.shape
    n = -(-T // chunk)
    extra = n * chunk - T
    mask = mask.astype(jnp.float32)

    def chunks(a):  # [B,T,...] -> [n,B,C,...], padded
        a = jnp.pad(a, [(0, 0), (0, extra)] + [(0, 0)] * (a.ndim - 2))
        return jnp.moveaxis(a.reshape(B, n, chunk, *a.shape[2:]), 1, 0)

    @jax.checkpoint
    def chunk_sums(h, t, m):
        logits = project(h)  # [B,C,V]
        sums = token_sums(logits, t, m, label_smoothing)
        wrong = (jnp.argmax(logits, axis=-1) != t) & (m != 0)  # [B,C]
        return sums, jnp.sum(wrong, axis=-1, dtype=jnp.int32)

    def body(carry, xs):
        return jax.tree.map(jnp.add, carry, chunk_sums(*xs)), None

    zeros = ({k: jnp.zeros((), jnp.float32) for k in TOKEN_SUMS}, jnp.zeros((B,), jnp.int32))
    xs = (chunks(head_inputs), chunks(targets), chunks(mask))
    sums, wrong = jax.lax.scan(body, zeros, xs)[0]
    counted = jnp.any(mask != 0, axis=-1)  # [B]
    return {
        **sums,
        "exact": jnp.sum(counted & (wrong == 0), dtype=jnp.int32).astype(jnp.float32),
        "sequences": jnp.sum(counted, dtype=jnp.int32).astype(jnp.float32),
    }
