"""Transformer blocks (Vaswani et al. 2017): encoder / decoder-only, decoder with cross-attention.

Every sublayer is wrapped by :func:`residual`: pre-norm ``x + f(LN(x))`` or post-norm
``LN(x + f(x))`` (post-norm; pre-norm: Xiong et al. 2020), with dropout on the sublayer output.
Blocks have the signature ``block(x, cache, inputs) -> (x, cache)`` so that
:class:`tfmjax.layers.stack.LayerStack` can scan over them; ``inputs`` is a
:class:`BlockInputs` holding what every layer shares (positions, segment ids, ...).

Hooks ``[B,T,D]`` (see :mod:`tfmjax.layers.hooks`): ``hook_resid_pre``, ``hook_resid_mid``
(after self-attention), ``hook_resid_mid_cross`` (after cross-attention), ``hook_resid_post``,
and each sublayer's output ``hook_attn_out``, ``hook_cross_attn_out``, ``hook_mlp_out``.

TransformerLens's sublayer inputs, which feed the sublayer only, never the residual sum:
``hook_mlp_in [B,T,D]`` (before ``ln2``), and for softmax self-attention the residual
repeated per head, before ``ln1``: ``attn.hook_attn_in [B,T,N,D]``, then ``attn.hook_q_input
[B,T,N,D]`` and ``attn.hook_k_input``/``attn.hook_v_input [B,T,K,D]`` (the first K heads of
``hook_attn_in``). While none of these four is edited the attention reads ``[B,T,D]`` as
usual; an edit sends each head its own normalised row (:class:`HeadInputs`), ``ln1``'s hooks
then recorded per head.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.layers.attention import HeadInputs, MultiHeadAttention
from tfmjax.layers.attention_variants import ATTENTION_VARIANTS
from tfmjax.layers.axes import BATCH, EMBED, LENGTH, constrain
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.dropout import Dropout
from tfmjax.layers.hooks import edited, hook, wanted
from tfmjax.layers.mlp import FeedForward
from tfmjax.layers.moe import MoEFeedForward
from tfmjax.layers.norms import make_norm

# The hook on each sublayer's output (before dropout and the residual sum).
_OUT_HOOKS = {
    "attention": "hook_attn_out",
    "cross_attention": "hook_cross_attn_out",
    "mlp": "hook_mlp_out",
}
# TransformerLens's split inputs of self-attention (see the module docstring).
_SPLIT_INPUTS = ("attn.hook_attn_in", "attn.hook_q_input", "attn.hook_k_input", "attn.hook_v_input")


class BlockInputs(NamedTuple):
    """Per-call inputs shared by every layer of a stack (all optional but ``positions``)."""

    positions: Any  # [B,T] absolute positions (RoPE)
    segment_ids: Any = None  # [B,T] 0 = padding
    alibi_slopes: Any = None  # [N]
    bias: Any = None  # [1|B, N, T, S] (relative position bias)
    encoded: Any = None  # [B,S,D] encoder output (cross-attention)
    encoded_segment_ids: Any = None  # [B,S]


def residual(
    x,
    sublayer,
    norm: nn.Module,
    *,
    norm_position: str,
    dropout: nn.Module,
    deterministic: bool,
    in_hook=lambda x: x,
    out_hook=lambda y: y,
):
    """Pre-norm ``x + drop(f(LN(x)))`` or post-norm ``LN(x + drop(f(x)))``; returns (x, aux).
    ``in_hook`` sees (and may replace) the sublayer's input, not the residual's (an array, or
    a tuple of arrays the pre-norm normalises each of); ``out_hook`` the sublayer's output."""
    if norm_position == "pre":
        y, aux = sublayer(jax.tree.map(norm, in_hook(x)))
        x = x + dropout(out_hook(y), deterministic=deterministic)
    else:
        y, aux = sublayer(in_hook(x))
        x = norm(x + dropout(out_hook(y), deterministic=deterministic))
    return constrain(x, BATCH, LENGTH, EMBED), aux


class _Block(nn.Module):
    cfg: BlockConfig
    deterministic: bool = True
    moe: bool = False  # the feed-forward is a mixture of experts (cfg.moe_*)

    def _self_attention(self, name: str):
        """The block's self-attention, of the variant ``cfg.attention``."""
        return ATTENTION_VARIANTS[self.cfg.attention].from_block_config(self.cfg, name)

    def _sublayer(self, x, fn, name: str, in_hook=lambda x: x):
        c = self.cfg
        return residual(
            x,
            fn,
            make_norm(c.norm, c.norm_eps, name=f"{name}_norm"),
            norm_position=c.norm_position,
            dropout=Dropout(c.dropout_rate),
            deterministic=self.deterministic,
            in_hook=in_hook,
            out_hook=lambda y: hook(self, _OUT_HOOKS[name], y),
        )

    def _attention_input(self, x):
        """Self-attention's input: ``x [B,T,D]``, or :class:`HeadInputs` (rows per head)
        when a split-input hook is edited (module docstring)."""
        c = self.cfg
        splits = getattr(ATTENTION_VARIANTS[c.attention], "split_inputs", False)
        if not splits or not any(wanted(self, n) for n in _SPLIT_INPUTS):
            return x
        N, K = c.num_heads, c.num_kv_heads
        attn_in = hook(
            self,
            "attn.hook_attn_in",
            jnp.broadcast_to(x[:, :, None], (*x.shape[:2], N, x.shape[-1])),
        )
        q_in = hook(self, "attn.hook_q_input", attn_in)
        k_in = hook(self, "attn.hook_k_input", attn_in[:, :, :K])
        v_in = hook(self, "attn.hook_v_input", attn_in[:, :, :K])
        if not any(edited(self, n) for n in _SPLIT_INPUTS):
            return x
        return HeadInputs(q_in, k_in, v_in)

    def _feed_forward_module(self):
        """The dense feed-forward ``mlp`` (its sublayer's function, without norm and sum)."""
        c = self.cfg
        return FeedForward(
            c.d_ff,
            c.activation,
            mlp_bias=c.mlp_bias,
            dropout_rate=c.dropout_rate,
            dtype=c.dtype,
            name="mlp",
        )

    def _feed_forward(self, x, segment_ids=None, cache=None):
        """The feed-forward sublayer: dense, a mixture of experts when ``moe`` (padding,
        ``segment_ids`` 0, is routed nowhere), or the self-mixer's own (rwkv's channel-mix,
        which carries its entries of the layer's decoding ``cache``): ``(x, cache)``."""
        c = self.cfg
        own = getattr(ATTENTION_VARIANTS[c.attention], "feed_forward", None)
        if own is not None:
            ff = own.from_block_config(c, "mlp")
            x, cache = self._sublayer(
                x,
                lambda h: ff(h, segment_ids, cache, deterministic=self.deterministic),
                "mlp",
                in_hook=lambda h: hook(self, "hook_mlp_in", h),
            )
            return hook(self, "hook_resid_post", x), cache
        common = dict(mlp_bias=c.mlp_bias, dropout_rate=c.dropout_rate, dtype=c.dtype, name="mlp")
        if self.moe:
            ff = MoEFeedForward(
                c.moe_experts,
                c.moe_top_k,
                c.d_ff,
                c.activation,
                capacity_factor=c.moe_capacity_factor,
                eval_capacity_factor=c.moe_eval_capacity_factor,
                renormalize=c.moe_renormalize,
                **common,
            )
            args = (None if segment_ids is None else segment_ids > 0,)
        else:
            ff, args = self._feed_forward_module(), ()
        x, _ = self._sublayer(
            x,
            lambda h: (ff(h, *args, deterministic=self.deterministic), None),
            "mlp",
            in_hook=lambda h: hook(self, "hook_mlp_in", h),
        )
        return hook(self, "hook_resid_post", x), cache


class SelfAttentionBlock(_Block):
    """Encoder block (``causal=False``) or decoder-only block (``causal=True``)."""

    causal: bool = False

    @nn.compact
    def __call__(self, x, cache, inputs: BlockInputs):
        x = hook(self, "hook_resid_pre", x)
        attn = self._self_attention("attention")
        x, cache = self._sublayer(
            x,
            lambda h: attn(
                h,
                q_positions=inputs.positions,
                q_segment_ids=inputs.segment_ids,
                kv_segment_ids=inputs.segment_ids,
                causal=self.causal,
                alibi_slopes=inputs.alibi_slopes,
                bias=inputs.bias,
                cache=cache,
            ),
            "attention",
            in_hook=self._attention_input,
        )
        x = hook(self, "hook_resid_mid", x)
        return self._feed_forward(x, inputs.segment_ids, cache)


class DecoderBlock(_Block):
    """Causal self-attention, cross-attention to the encoder output, feed-forward.

    Decoding cache: ``{"self": <KV cache>, "cross": {"k", "v"}}``; a cache without ``"cross"``
    gets the encoder's keys and values computed once, here, and stored.
    """

    @nn.compact
    def __call__(self, x, cache, inputs: BlockInputs):
        x = hook(self, "hook_resid_pre", x)
        self_attn = self._self_attention("attention")
        x, self_cache = self._sublayer(
            x,
            lambda h: self_attn(
                h,
                q_positions=inputs.positions,
                q_segment_ids=inputs.segment_ids,
                kv_segment_ids=inputs.segment_ids,
                causal=True,
                alibi_slopes=inputs.alibi_slopes,
                bias=inputs.bias,
                cache=None if cache is None else cache["self"],
            ),
            "attention",
            in_hook=self._attention_input,
        )
        x = hook(self, "hook_resid_mid", x)
        # No RoPE and no sparse pattern across sequences: encoder slots are not decoder positions.
        cross = MultiHeadAttention.from_block_config(self.cfg, "cross_attention", cross=True)
        cross_kv = None
        if cache is not None:
            cross_kv = cache.get("cross") or dict(
                zip("kv", cross.project_kv(inputs.encoded), strict=True)
            )
            cache = {"self": self_cache, "cross": cross_kv}
            cross_kv = (cross_kv["k"], cross_kv["v"])
        x, _ = self._sublayer(
            x,
            lambda h: cross(
                h,
                inputs.encoded,
                q_positions=inputs.positions,
                q_segment_ids=inputs.segment_ids,
                kv_segment_ids=inputs.encoded_segment_ids,
                kv=cross_kv,
            ),
            "cross_attention",
        )
        x = hook(self, "hook_resid_mid_cross", x)
        x, self_cache = self._feed_forward(x, inputs.segment_ids, self_cache)
        return x, cache if cache is None else dict(cache, self=self_cache)


EncoderBlock = SelfAttentionBlock
