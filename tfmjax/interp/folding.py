"""Fold the final norm's weight and bias into the unembedding, as TransformerLens does.

A pre-norm model's logits are ``norm(x) W_U + b_U`` with ``norm(x) = x̂ · γ + β`` (``x̂``:
centred for LayerNorm, divided by its scale). With ``W_U' = diag(γ) W_U`` and ``b_U' = b_U +
β W_U`` the same logits come from ``x̂ W_U' + b_U'``: the folded model's final norm has
``γ = 1, β = 0`` (TransformerLens's ``LNPre``), so its direct logit attributions read the
unembedding alone, as TransformerLens's ``fold_ln`` assumes. A tied model gets its own
unembedding (``tie_embeddings=False``), since the token table stays the input's.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from tfmjax.interp.circuits import embedding_matrices


def fold_final_norm(model, params):
    """``(model, params)`` with the final norm folded into the unembedding (module
    docstring): the same logits up to float rounding."""
    cfg = model.config
    if cfg.norm_position != "pre":
        raise ValueError("folding the final norm needs a pre-norm model (model.norm_position)")
    if cfg.mlm_head:
        raise ValueError("folding the final norm needs a linear head; model.mlm_head is not")
    head = dict(params["params"]["head"])
    norm = dict(head["final_norm"])
    _, W_U = embedding_matrices(model, params)  # [D,V]
    gamma = norm["scale"].astype(jnp.float32)
    kernel = gamma[:, None] * W_U.astype(jnp.float32)
    bias = head["output_bias"].astype(jnp.float32) if cfg.output_bias else 0.0
    if "bias" in norm:
        bias = bias + norm["bias"].astype(jnp.float32) @ W_U.astype(jnp.float32)
        norm["bias"] = jnp.zeros_like(norm["bias"])
    norm["scale"] = jnp.ones_like(norm["scale"])
    head.update(final_norm=norm, lm_head={"kernel": kernel.astype(W_U.dtype)})
    has_bias = cfg.output_bias or "bias" in norm
    if has_bias:
        head["output_bias"] = jnp.broadcast_to(bias, (cfg.vocab_size,)).astype(W_U.dtype)
    folded_cfg = dataclasses.replace(
        cfg, tie_embeddings=False, scale_tied_output=False, output_bias=has_bias
    )
    folded = dict(params, params=dict(params["params"], head=head))
    return type(model)(folded_cfg, deterministic=model.deterministic), folded
