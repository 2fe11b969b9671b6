"""Linformer self-attention (Wang et al. 2020) as a self-attention variant
(``model.attention = "linformer"``), bidirectional only and fixed-length.

Projections as in :mod:`tfmjax.layers.attention` (``query [D,N,H]``, ``key``/``value
[D,K,H]``, ``out [N,H,D]``; GQA/MQA by ``K``), plus the sequence projections ``proj_e``
and ``proj_f [R,T_max]`` (``R`` = ``rank``, ``T_max`` = ``model.max_len``), one pair per
layer shared by its heads (the paper's headwise sharing); ``share_kv`` uses ``proj_e`` for
both (its key-value sharing, ``E = F``). Initialised uniform in ``±1/√R``, as in common
implementations. Their axes are named (``None``, ``length``): no sharding rule splits them,
so every device holds them (``R·T_max`` numbers a layer). RoPE, when the model uses it,
rotates ``q`` and ``k`` before the projection. The attention itself is
:func:`tfmjax.kernels.linformer.linformer_attention`: ``O(T·R)`` instead of ``O(T²)``.
Padding (segment id 0) is zeroed before the projection, so it contributes nothing.

Bidirectional only (``bidirectional_only``): there is no causal form (each projected key
mixes every position, future ones included), so there is no decoding cache. An
encoder_only model uses it in every block; an encoder_decoder model in its encoder, while
the decoder keeps softmax self-attention; a decoder_only model refuses it in the config.

Hooks (:mod:`tfmjax.layers.hooks`), under the block's ``attn.`` (float32 past the
projections):

- ``hook_q [B,T,N,H]``, ``hook_k``/``hook_v [B,S,K,H]``: the projections (before RoPE);
  ``hook_rot_q``/``hook_rot_k``: after RoPE (RoPE models only);
- ``hook_k_proj``/``hook_v_proj [B,R,K,H]``: ``E K`` and ``F V``, after the sequence
  projection;
- ``hook_pattern [B,N,T,R]``: ``softmax(Q (E K)ᵀ/√H)``, each query over the ``R``
  projected keys (not over tokens: head scores refuse it);
- ``hook_z [B,T,N,H]``: the per-head output ``P (F V)``;
- ``hook_result [B,T,N,D]``: each head's share of the output, before the sum and the bias.

QK/OV circuits (:mod:`tfmjax.interp.circuits`) apply, as for Nyström: the logit of query
``t`` at projected key ``r`` is ``Σ_s E[r,s] x_t W_Q W_Kᵀ x_sᵀ``, an ``E``-weighted sum of
the QK circuit's bilinear form; and each head writes ``(P F) (x W_V) W_O``, a mix (by
``P F``, whose weights need not be positive) of its rows' ``x W_V W_O``: what OV describes,
per unit of mixing weight.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from tfmjax.kernels.linformer import TAPS, linformer_attention
from tfmjax.layers.attention import head_projections, through_result
from tfmjax.layers.axes import LENGTH, named
from tfmjax.layers.bidirectional import BidirectionalOnly
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.hooks import hook, wanted
from tfmjax.layers.positions import apply_rope


class LinformerAttention(BidirectionalOnly, nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], None)``: Linformer self-attention (bidirectional)."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_len: int  # T_max: the columns of the sequence projections
    rank: int = 8  # R, the paper's k
    share_kv: bool = False  # E = F
    attention_bias: bool = True
    rope_base: float | None = None
    rope_layout: str = "interleaved"
    scale: float | None = None  # of the logits; None: 1/sqrt(head_dim)
    dtype: jnp.dtype = jnp.float32
    # Per-head query, key, value and out kernels: logits are E-weighted sums of
    # x_q W_Q W_Kᵀ x_sᵀ, and each head writes a mix (P F) of its rows' x W_V W_O.
    qk_ov_circuits: ClassVar[bool] = True
    # hook_pattern is over the R projected keys, not over tokens.
    token_pattern: ClassVar[bool] = False
    variant: ClassVar[str] = "linformer"  # no causal form: decoders keep softmax

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        """The block's Linformer self-attention (no sparse pattern, no score biases)."""
        return cls(
            c.d_model,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            max_len=c.max_len,
            rank=c.linformer_rank,
            share_kv=c.linformer_share_kv,
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
        # Uniform in ±1/sqrt(R): fan_in is the first axis, R, of [R,T_max].
        uniform = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
        init = named(uniform, None, LENGTH)
        shape = (self.rank, self.max_len)
        self.proj_e = self.param("proj_e", init, shape)
        self.proj_f = self.proj_e if self.share_kv else self.param("proj_f", init, shape)

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
            raise ValueError("linformer attention is self-attention without score biases")
        self.refuse_causal(causal, cache)
        if x.shape[1] > self.max_len:
            raise ValueError(
                f"linformer projects at most model.max_len={self.max_len} positions, "
                f"got a row of {x.shape[1]}"
            )
        q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (hook(self, f"hook_{n}", a) for n, a in (("q", q), ("k", k), ("v", v)))
        if self.rope_base is not None:
            rope = lambda a: apply_rope(a, q_positions, self.rope_base, self.rope_layout)  # noqa: E731
            q, k = hook(self, "hook_rot_q", rope(q)), hook(self, "hook_rot_k", rope(k))
        keep = None if kv_segment_ids is None else kv_segment_ids != 0
        out = linformer_attention(
            q,
            k,
            v,
            self.proj_e,
            self.proj_f,
            mask=keep,
            scale=self.scale,
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
