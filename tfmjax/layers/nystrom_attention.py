"""Nyström self-attention (Xiong et al. 2021, Nyströmformer) as a self-attention variant
(``model.attention = "nystrom"``), bidirectional only.

Projections as in :mod:`tfmjax.layers.attention` (``query [D,N,H]``, ``key``/``value
[D,K,H]``, ``out [N,H,D]``; GQA/MQA by ``K``); RoPE, when the model uses it, rotates ``q``
and ``k`` before the landmarks are taken. The attention itself is
:func:`tfmjax.kernels.nystrom.nystrom_attention` with ``num_landmarks`` landmarks: ``O(T·M)``
instead of ``O(T²)``. Padding (segment id 0) enters neither the landmarks nor the keys.

Bidirectional only (``bidirectional_only``): there is no causal form (a landmark is a mean
over a whole segment, future tokens included), so there is no decoding cache. An
encoder_only model uses it in every block; an encoder_decoder model in its encoder, while
the decoder keeps softmax self-attention; a decoder_only model refuses it in the config.
With ``conv_width`` > 0, the paper's skip path adds a depthwise convolution over ``V``
(``conv_kernel [W,N]``, one kernel per query head) to the attention output.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from tfmjax.kernels.nystrom import nystrom_attention
from tfmjax.layers.attention import head_projections
from tfmjax.layers.axes import HEADS, named
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.positions import apply_rope

NO_CACHE = "model.attention='nystrom' is bidirectional only and has no decoding cache"


class NystromAttention(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], None)``: Nyström self-attention (bidirectional)."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_landmarks: int = 8
    conv_width: int = 0  # the paper's depthwise convolution over V (odd; 0: none)
    attention_bias: bool = True
    rope_base: float | None = None
    rope_layout: str = "interleaved"
    scale: float | None = None  # of the logits; None: 1/sqrt(head_dim)
    dtype: jnp.dtype = jnp.float32
    qk_ov_circuits: ClassVar[bool] = False  # landmarks and a pseudo-inverse between q and k
    causal_only: ClassVar[bool] = False
    bidirectional_only: ClassVar[bool] = True  # no causal form: decoders keep softmax

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        """The block's Nyström self-attention (no sparse pattern, no score biases)."""
        return cls(
            c.d_model,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            num_landmarks=c.num_landmarks,
            conv_width=c.nystrom_conv,
            attention_bias=c.attention_bias,
            rope_base=c.rope_base,
            rope_layout=c.rope_layout,
            scale=c.attention_scale,
            dtype=c.dtype,
            name=name,
        )

    @classmethod
    def init_cache(cls, c: BlockConfig, batch: int, capacity: int) -> dict:
        """Refused: there is no decoding form (decoders keep softmax self-attention)."""
        raise ValueError(NO_CACHE)

    @classmethod
    def cache_bytes(cls, c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """Refused, as :meth:`init_cache`."""
        raise ValueError(NO_CACHE)

    def setup(self):
        sizes = (self.d_model, self.num_heads, self.num_kv_heads, self.head_dim)
        self.query, self.key, self.value, self.out = head_projections(
            *sizes, self.attention_bias, self.dtype
        )
        if self.conv_width:
            # PyTorch's Conv2d default (the paper's code): uniform in ±1/sqrt(W).
            init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
            shape = (self.conv_width, self.num_heads)
            self.conv_kernel = self.param("conv_kernel", named(init, None, HEADS), shape)

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
            raise ValueError("nystrom attention is self-attention without score biases")
        if causal or cache is not None:
            raise ValueError(NO_CACHE.replace("no decoding cache", "no causal form"))
        q, k, v = self.query(x), self.key(x), self.value(x)
        if self.rope_base is not None:
            q = apply_rope(q, q_positions, self.rope_base, self.rope_layout)
            k = apply_rope(k, q_positions, self.rope_base, self.rope_layout)
        keep = None if kv_segment_ids is None else kv_segment_ids != 0
        out = nystrom_attention(
            q,
            k,
            v,
            num_landmarks=self.num_landmarks,
            mask=keep,
            scale=self.scale,
            conv_kernel=self.conv_kernel if self.conv_width else None,
        )
        return self.out(out), None
