"""Linear (kernelised) self-attention: Katharopoulos et al. 2020, Performer (Choromanski et
al. 2021).

Projections as in :mod:`tfmjax.layers.attention` (``query [D,N,H]``, ``key``/``value
[D,K,H]``, ``out [N,H,D]``; GQA/MQA by ``K``); the softmax is replaced by a feature map
``φ`` (``elu``: ``elu(x)+1``; ``favor``: FAVOR+ positive random features), so attention costs
``O(T·F·H)`` (:mod:`tfmjax.kernels.linear`). RoPE, when the model uses it, rotates ``q`` and
``k`` before ``φ``. FAVOR+'s random projection ``[F,H]`` is drawn from a fixed key (the same
in every layer) and is not trained.

Decoding carries a constant-size state per layer instead of a growing KV cache:
``{"s": [B,K,F,H], "z": [B,K,F], "m": [B,K], "index": []}`` (``Σ φ(k) vᵀ`` and ``Σ φ(k)``,
both scaled by ``exp(-m)``; see :func:`tfmjax.kernels.linear.init_linear_state`). Padding
(segment id 0) is left out of every sum; packed sequences (segment ids > 1) are not
separated, so train on padded, not packed, batches.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels.linear import (
    favor_projection,
    init_linear_state,
    linear_attention,
    linear_attention_step,
)
from tfmjax.layers.attention import head_projections
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.positions import apply_rope

PROJECTION_SEED = 0  # FAVOR+'s fixed random features


def init_linear_cache(batch: int, num_kv_heads: int, num_features: int, head_dim: int, dtype):
    """An empty linear-attention decoding state for one layer (its size never grows)."""
    return dict(
        init_linear_state(batch, num_kv_heads, num_features, head_dim, dtype),
        index=jnp.zeros((), jnp.int32),
    )


class LinearAttention(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], cache)``: kernelised self-attention."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    feature_map: str = "elu"
    num_features: int = 64  # favor only
    attention_bias: bool = True
    rope_base: float | None = None
    rope_layout: str = "interleaved"
    dtype: jnp.dtype = jnp.float32
    qk_ov_circuits: ClassVar[bool] = False  # a feature map, not a softmax, between q and k
    causal_only: ClassVar[bool] = False  # also bidirectional (encoders)
    bidirectional_only: ClassVar[bool] = False  # also causal (decoders)

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        """The block's linear self-attention (no sparse pattern, no score scale)."""
        return cls(
            c.d_model,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            feature_map=c.feature_map,
            num_features=c.num_features,
            attention_bias=c.attention_bias,
            rope_base=c.rope_base,
            rope_layout=c.rope_layout,
            dtype=c.dtype,
            name=name,
        )

    @staticmethod
    def state_features(c: BlockConfig) -> int:
        """Features ``F`` of the feature map: the head width (elu) or ``num_features``."""
        return c.num_features if c.feature_map == "favor" else c.head_dim

    @classmethod
    def init_cache(cls, c: BlockConfig, batch: int, capacity: int) -> dict:
        """One layer's empty state ``s [B,K,F,H]``, ``z [B,K,F]``, ``m [B,K]`` (``capacity``
        does not matter: the state never grows)."""
        F = cls.state_features(c)
        return init_linear_cache(batch, c.num_kv_heads, F, c.head_dim, c.dtype)

    @classmethod
    def cache_bytes(cls, c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """Bytes of the states of ``num_layers`` layers: ``B·L·K·F·(H+1)`` in ``dtype`` plus
        the float32 log scale ``B·L·K·4`` (no ``S``)."""
        F, size = cls.state_features(c), np.dtype(c.dtype).itemsize
        return batch * num_layers * c.num_kv_heads * (F * (c.head_dim + 1) * size + 4)

    def setup(self):
        sizes = (self.d_model, self.num_heads, self.num_kv_heads, self.head_dim)
        self.query, self.key, self.value, self.out = head_projections(
            *sizes, self.attention_bias, self.dtype
        )

    def projection(self):
        """FAVOR+'s ``[F,H]`` random matrix (None for elu)."""
        if self.feature_map != "favor":
            return None
        key = jax.random.key(PROJECTION_SEED)
        return favor_projection(key, self.num_features, self.head_dim)

    def __call__(
        self,
        x,
        context=None,
        *,
        q_positions,
        kv_positions=None,
        q_segment_ids=None,
        kv_segment_ids=None,
        causal=False,
        alibi_slopes=None,
        bias=None,
        cache=None,
        kv=None,
    ):
        if context is not None or kv is not None or alibi_slopes is not None or bias is not None:
            raise ValueError("linear attention is self-attention without score biases")
        q, k, v = self.query(x), self.key(x), self.value(x)
        if self.rope_base is not None:
            q = apply_rope(q, q_positions, self.rope_base, self.rope_layout)
            k = apply_rope(k, q_positions, self.rope_base, self.rope_layout)
        kw = dict(feature_map=self.feature_map, projection=self.projection())
        keep = None if kv_segment_ids is None else kv_segment_ids != 0
        if cache is None:
            out = linear_attention(q, k, v, causal=causal, kv_mask=keep, **kw)
            return self.out(out), None
        state = {name: value for name, value in cache.items() if name != "index"}
        keep = None if q_segment_ids is None else q_segment_ids != 0
        out, state = linear_attention_step(state, q, k, v, kv_mask=keep, **kw)
        return self.out(out), dict(state, index=cache["index"] + x.shape[1])
