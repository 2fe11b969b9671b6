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

Hooks (:mod:`tfmjax.layers.hooks`), under the block's ``attn.``; ``M`` landmarks, the
kernels named by the paper's eq. 14 (``F̃``, ``Ã``, ``B̃``; float32):

- ``hook_q [B,T,N,H]``, ``hook_k``/``hook_v [B,S,K,H]``: the projections (TransformerLens's
  meaning: before RoPE); ``hook_rot_q``/``hook_rot_k``: after RoPE (RoPE models only), as
  the kernel reads them;
- ``hook_landmarks_q [B,M,N,H]``, ``hook_landmarks_k [B,M,K,H]``: the segment means ``Q̃``,
  ``K̃`` of the queries and keys (padding left out);
- ``hook_kernel_f [B,N,T,M]``: ``softmax(Q K̃ᵀ/√H)``, each query over the landmark keys;
- ``hook_kernel_a [B,N,M,M]``: ``softmax(Q̃ K̃ᵀ/√H)``, the one that is pseudo-inverted;
- ``hook_kernel_b [B,N,M,S]``: ``softmax(Q̃ Kᵀ/√H)``, each landmark query over the keys;
- ``hook_z [B,T,N,H]``: the per-head output ``F̃ Ã⁺ (B̃ V)`` (plus the convolution over
  ``V`` with ``conv_width``);
- ``hook_result [B,T,N,D]``: each head's share of the output, before the sum and the bias.

The kernel forms the landmarks and the three kernels anyway; a hook only passes them
through (reshaped to one axis of query heads) when it is asked for, and an edit flows into
what follows (an edited ``Ã`` is the one pseudo-inverted). There is no ``hook_pattern``
(the product ``F̃ Ã⁺ B̃`` is never formed, and is not a softmax), so head scores refuse
the stacks that use it; QK/OV circuits apply (:mod:`tfmjax.interp.circuits`).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from tfmjax.kernels.nystrom import TAPS, nystrom_attention
from tfmjax.layers.attention import head_projections, through_result
from tfmjax.layers.axes import HEADS, named
from tfmjax.layers.bidirectional import BidirectionalOnly
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.hooks import hook, wanted
from tfmjax.layers.positions import apply_rope


class NystromAttention(BidirectionalOnly, nn.Module):
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
    # Per-head query, key, value and out kernels: every kernel's logits are segment means of
    # x_q W_Q W_Kᵀ x_kᵀ, and each head writes a mix of its rows' x W_V W_O (QK/OV circuits).
    qk_ov_circuits: ClassVar[bool] = True
    variant: ClassVar[str] = "nystrom"  # no causal form: decoders keep softmax

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
        self.refuse_causal(causal, cache)
        q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (hook(self, f"hook_{n}", a) for n, a in (("q", q), ("k", k), ("v", v)))
        if self.rope_base is not None:
            rope = lambda a: apply_rope(a, q_positions, self.rope_base, self.rope_layout)  # noqa: E731
            q, k = hook(self, "hook_rot_q", rope(q)), hook(self, "hook_rot_k", rope(k))
        keep = None if kv_segment_ids is None else kv_segment_ids != 0
        out = nystrom_attention(
            q,
            k,
            v,
            num_landmarks=self.num_landmarks,
            mask=keep,
            scale=self.scale,
            conv_kernel=self.conv_kernel if self.conv_width else None,
            taps={
                n: functools.partial(hook, self, f"hook_{n}")
                for n in TAPS
                if wanted(self, f"hook_{n}")
            },
        )
        out = hook(self, "hook_z", out)
        if wanted(self, "hook_result"):
            return through_result(self, out), None
        return self.out(out), None
