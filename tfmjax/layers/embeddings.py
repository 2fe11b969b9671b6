"""Token embedding with an optional tied output projection (weight tying, Press & Wolf 2017)."""

from __future__ import annotations

import flax.linen as nn
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
        """Tied output projection: logits = x E^T."""
        logits = jnp.einsum(
            "BTD,VD->BTV", x, self.embedding.astype(self.dtype), preferred_element_type=jnp.float32
        )
        return constrain(logits, BATCH, LENGTH, VOCAB)
