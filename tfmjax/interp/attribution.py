"""Direct logit attribution (Elhage et al. 2021; nostalgebraist 2020's logit lens).

In a pre-norm model the final residual stream is a sum of parts: the token (and position)
embedding, each attention head's output ``hook_result``, each attention output bias, each
MLP output (and, in an encoder-decoder's decoder, each cross-attention head). The final norm
is linear once its scale ``s`` (``ln_final.hook_scale``, the denominator) is frozen from the
cache:

    LayerNorm:  y = (x − mean(x)) / s · γ + β        RMSNorm:  y = x / s · γ

so ``logits = Σ_c unembed((c − mean(c)) / s · γ) + unembed(β) + output bias``: each part's
direct contribution to the logits, which add up to the logits exactly (up to float error).
"""

from __future__ import annotations

import jax.numpy as jnp

from tfmjax.interp.circuits import unembedding_matrix
from tfmjax.interp.hooked import ActivationCache, prepare


def residual_parts(model, cache: ActivationCache, stack: str | None = None) -> dict:
    """``{part name: [B,T,D]}`` whose sum is the residual stream the final norm reads.

    Names: ``embed``, ``pos_embed``, ``L{l}H{n}`` (self-attention head), ``L{l}attn_bias``,
    ``L{l}X{n}`` (cross-attention head), ``L{l}cross_bias``, ``L{l}mlp``; a layer whose
    attention has no per-head output (MLA, linear attention) gives ``L{l}attn`` whole.
    ``stack``: default the one the output head reads (``model.head_stack``).
    """
    cfg, stack = model.config, stack or model.head_stack
    if cfg.norm_position != "pre":
        raise ValueError(
            "direct logit attribution needs a pre-norm model (model.norm_position='pre'): a "
            "post-norm block renormalises the residual stream, so its parts do not add up"
        )
    if cfg.mlm_head:
        raise ValueError("direct logit attribution needs a linear head; model.mlm_head is not")
    parts = {}
    first = cache[f"{stack}.blocks.0.hook_resid_pre"]
    embed, pos = f"{stack}.hook_embed", f"{stack}.hook_pos_embed"
    if cfg.embed_norm or cfg.type_vocab_size:  # the embedding is not a sum of its tables
        parts["embed"] = first
    else:
        parts["embed"] = cache[embed]
        if pos in cache.activations:
            parts["pos_embed"] = cache[pos]
    sublayers = (("attn", "H", "attn_bias"), ("cross_attn", "X", "cross_bias"))
    for l in range(model.layer_stacks()[stack]):
        block = f"{stack}.blocks.{l}"
        for sub, letter, bias in sublayers:
            out = f"{block}.hook_{sub}_out"
            if out not in cache.activations:
                continue
            result = f"{block}.{sub}.hook_result"
            if result not in cache.activations:
                parts[f"L{l}{sub}"] = cache[out]
                continue
            heads = cache[result]  # [B,T,N,D]
            for n in range(heads.shape[2]):
                parts[f"L{l}{letter}{n}"] = heads[:, :, n]
            parts[f"L{l}{bias}"] = cache[out] - jnp.sum(heads, axis=2)
        parts[f"L{l}mlp"] = cache[f"{block}.hook_mlp_out"]
    return parts


def logit_attribution(model, params, cache: ActivationCache, tokens=None, stack=None):
    """``(names [C], contributions)``: each residual part's direct effect on the logits
    through the frozen final norm, plus ``norm_bias`` and ``output_bias`` when present.

    ``tokens``: ``None`` gives ``[C,B,T,V]``; ``[B,T]`` ids give ``[C,B,T]`` (the logit of
    each position's own token); ``([B,T], [B,T])`` gives ``[C,B,T]`` logit differences.
    Summed over ``C`` they equal the logits (the cache must come from this model's run).
    """
    cfg, stack = model.config, stack or model.head_stack
    if stack != model.head_stack:
        raise ValueError(
            "direct logit attribution reads the stack the output head reads "
            f"({model.head_stack!r}), not {stack!r}"
        )
    model, params = prepare(model, params)
    parts = residual_parts(model, cache, stack)
    W_U = unembedding_matrix(model, params)  # [D,V]
    norm = params["params"]["head"]["final_norm"]
    inverse = 1.0 / cache[f"{stack}.ln_final.hook_scale"].astype(jnp.float32)  # [B,T,1]
    gamma = norm["scale"].astype(jnp.float32).reshape(1, 1, -1)

    def through_norm(x):
        x = x.astype(jnp.float32)
        if cfg.norm == "layernorm":
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        return x * inverse * gamma

    names = list(parts)
    ys = [through_norm(parts[n]) for n in names]
    if cfg.norm == "layernorm":
        names.append("norm_bias")
        ys.append(jnp.broadcast_to(norm["bias"].astype(jnp.float32)[None, None], ys[0].shape))
    directions = _Unembed(W_U.astype(jnp.float32), tokens)
    contributions = [directions(y) for y in ys]
    if cfg.output_bias:
        names.append("output_bias")
        bias = params["params"]["head"]["output_bias"].astype(jnp.float32)
        contributions.append(directions.bias(bias, ys[0].shape[:2]))
    return names, jnp.stack(contributions)


class _Unembed:
    """Projection of ``[B,T,D]`` onto the unembedding: all logits, or chosen ones."""

    def __init__(self, W_U, tokens):
        self.W_U, self.tokens = W_U, tokens

    def __call__(self, y):
        if self.tokens is None:
            return jnp.einsum("BTD,DV->BTV", y, self.W_U)
        return jnp.einsum("BTD,BTD->BT", y, self._columns())

    def _columns(self):
        """``[B,T,D]`` unembedding direction of each position's token (or difference)."""
        if isinstance(self.tokens, tuple):
            good, bad = self.tokens
            return self.W_U.T[good] - self.W_U.T[bad]
        return self.W_U.T[self.tokens]

    def bias(self, bias, batch_time):
        if self.tokens is None:
            return jnp.broadcast_to(bias[None, None], (*batch_time, bias.shape[0]))
        if isinstance(self.tokens, tuple):
            return bias[self.tokens[0]] - bias[self.tokens[1]]
        return bias[self.tokens]
