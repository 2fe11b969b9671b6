"""Token embedding with an optional tied output projection (weight tying, Press & Wolf 2017)."""

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

    def attend(self, x):
        """Tied output projection: logits = x E^T, float32 ``[B,T,V]``."""
        logits = tied_logits(x.astype(self.dtype), self.embedding.astype(self.dtype))
        return constrain(logits, BATCH, LENGTH, VOCAB)


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
