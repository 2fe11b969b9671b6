"""Token embedding with an optional tied output projection (weight tying, Press & Wolf 2017),
and the untied output projection.

Both projections take ``columns`` >= V: the table or kernel is zero-padded to that many
vocabulary columns before the matmul (GPU matmuls run faster at a multiple of 128: GPT-2's
50,257 -> 50,304). The params keep V; the caller cuts the extra columns off."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.layers.axes import BATCH, EMBED, LENGTH, VOCAB, constrain, named


class TokenEmbedding(nn.Module):
    """``[V, D]`` table: ``embed(ids [B,T]) -> [B,T,D]``; ``attend(x [B,T,D]) -> [B,T,V]``."""

    vocab_size: int
    d_model: int
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        # std D^-1/2: tied logits x E^T start O(1) for a normalised x (scale_embeddings
        # multiplies the inputs back to unit variance, as in Vaswani et al.).
        init = named(nn.initializers.normal(self.d_model**-0.5), VOCAB, EMBED)
        self.embedding = self.param("embedding", init, (self.vocab_size, self.d_model))

    def __call__(self, ids):
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x, columns: int | None = None):
        """Tied output projection: logits = x E^T, float32 ``[B,T,columns]`` (default V),
        the columns past V zero."""
        table = pad_vocab(self.embedding.astype(self.dtype), 0, columns)
        logits = tied_logits(x.astype(self.dtype), table)
        return constrain(logits, BATCH, LENGTH, VOCAB)


class VocabProjection(nn.Module):
    """Untied output projection ``x [B,T,D] -> [B,T,columns]`` in the compute dtype: kernel
    ``[D,V]`` (``nn.Dense``'s initialiser and arithmetic), zero-padded to ``columns``."""

    vocab_size: int
    columns: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        init = named(nn.linear.default_kernel_init, EMBED, VOCAB)
        kernel = self.param("kernel", init, (x.shape[-1], self.vocab_size))
        x, kernel = nn.dtypes.promote_dtype(x, pad_vocab(kernel, 1, self.columns), dtype=self.dtype)
        return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def pad_vocab(a, axis: int, columns: int | None):
    """``a`` with zeros appended along its vocabulary ``axis`` up to ``columns`` entries."""
    extra = 0 if columns is None else columns - a.shape[axis]
    if extra <= 0:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return jnp.pad(a, widths)


@jax.custom_vjp
def tied_logits(x, table):
    """``x [B,T,D]`` and ``table [V,D]`` (compute dtype) -> float32 logits ``[B,T,V]``.

    The matmul runs in the compute dtype with float32 results, and so do the two of the
    backward pass: the float32 cotangent of the logits is rounded to the compute dtype first,
    as every other layer's cotangent already is. (Autodiff would multiply the float32
    cotangent by the bfloat16 operands, which XLA on GPU runs as a float32 matmul: the
    largest one of a small model's step.) With float32 compute this is plain autodiff."""
    logits = jnp.matmul(_rows(x), table.T, preferred_element_type=jnp.float32)  # [B*T,V]
    return logits.reshape(*x.shape[:-1], table.shape[0])


def _rows(a):
    """``[B,T,C] -> [B*T,C]``: XLA:CPU contracts a 2-D matmul over its rows in place, where a
    contraction over B and T copied the operand transposed (docs/cpu_speed.md)."""
    return a.reshape(-1, a.shape[-1])


def _tied_logits_fwd(x, table):
    return tied_logits(x, table), (x, table)


def _tied_logits_bwd(res, g):
    x, table = res
    g = _rows(g.astype(x.dtype))  # [B*T,V]
    dx = jnp.matmul(g, table, preferred_element_type=jnp.float32)  # [B*T,D]
    dtable = jnp.matmul(g.T, _rows(x), preferred_element_type=jnp.float32)  # [V,D]
    return dx.reshape(x.shape).astype(x.dtype), dtable.astype(table.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)
