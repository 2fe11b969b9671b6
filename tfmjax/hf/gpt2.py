"""GPT-2 (``GPT2LMHeadModel``): learned positions, pre-norm LayerNorm, GELU (tanh), tied head.

HF ``Conv1D`` weights are ``[in, out]``; ``c_attn`` holds query, key and value side by side.
"""

from __future__ import annotations

from tfmjax.config import ModelConfig
from tfmjax.hf.arch import Architecture
from tfmjax.hf.fields import Fields
from tfmjax.hf.mapping import Mapping, flat, fused, linear, same

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
ACTIVATIONS.update(relu="relu")
EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def config_from_hf(f: Fields) -> ModelConfig:
    d_model, vocab = f.get("n_embd"), f.get("vocab_size")
    f.ignore("resid_pdrop", "embd_pdrop", "attn_pdrop", "n_ctx")
    f.ignore(*(k for k in f.raw if k.startswith("summary_")))  # GPT2DoubleHeads only
    f.expect("scale_attn_weights", (True,), True)
    f.expect("scale_attn_by_inverse_layer_idx", (False,), False)
    f.expect("reorder_and_upcast_attn", (False,), False)
    f.expect("add_cross_attention", (False,), False)
    n_inner = f.get("n_inner", None)
    return ModelConfig(
        family="decoder_only",
        vocab_size=vocab,
        d_model=d_model,
        num_heads=f.get("n_head"),
        d_ff=4 * d_model if n_inner is None else n_inner,
        num_layers=f.get("n_layer"),
        max_len=f.get("n_positions"),
        position="learned",
        norm="layernorm",
        norm_position="pre",
        norm_eps=f.get("layer_norm_epsilon", 1e-5),
        activation=f.choose("activation_function", ACTIVATIONS, "gelu_new"),
        use_bias=True,
        tie_embeddings=f.get("tie_word_embeddings", True),
        bos_id=f.token_id("bos_token_id", vocab, 1),
    )


def config_to_hf(cfg: ModelConfig) -> dict:
    return {
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_embd": cfg.d_model,
        "n_head": cfg.num_heads,
        "n_inner": cfg.d_ff,
        "n_layer": cfg.num_layers,
        "n_positions": cfg.max_len,
        "layer_norm_epsilon": cfg.norm_eps,
        "activation_function": EXPORT_ACTIVATIONS.get(cfg.activation, cfg.activation),
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_id,
    }


def mapping(cfg: ModelConfig) -> Mapping:
    h = "transformer.h.{i}."
    layer = (
        fused(
            h + "attn.c_attn.weight",
            ("attention/query/kernel", "attention/key/kernel", "attention/value/kernel"),
            in_dims=1,
        ),
        fused(
            h + "attn.c_attn.bias",
            ("attention/query/bias", "attention/key/bias", "attention/value/bias"),
        ),
        flat(h + "attn.c_proj.weight", "attention/out/kernel", in_dims=2),
        same(h + "attn.c_proj.bias", "attention/out/bias"),
        same(h + "ln_1.weight", "attention_norm/scale"),
        same(h + "ln_1.bias", "attention_norm/bias"),
        same(h + "ln_2.weight", "mlp_norm/scale"),
        same(h + "ln_2.bias", "mlp_norm/bias"),
        same(h + "mlp.c_fc.weight", "mlp/up/kernel"),
        same(h + "mlp.c_fc.bias", "mlp/up/bias"),
        same(h + "mlp.c_proj.weight", "mlp/down/kernel"),
        same(h + "mlp.c_proj.bias", "mlp/down/bias"),
    )
    top = [
        same("transformer.wte.weight", "embed/token_embed/embedding"),
        same("transformer.wpe.weight", "embed/pos_embed/pos_embedding"),
        same("transformer.ln_f.weight", "head/final_norm/scale"),
        same("transformer.ln_f.bias", "head/final_norm/bias"),
    ]
    if not cfg.tie_embeddings:
        top.append(linear("lm_head.weight", "head/lm_head/kernel"))
    # Older checkpoints store the causal-mask buffers of each attention layer.
    return Mapping(tuple(top), (("decoder", cfg.num_layers, layer),), r"\.attn\.(masked_)?bias$")


ARCH = Architecture(
    name="gpt2",
    model_types=("gpt2",),
    hf_class="GPT2LMHeadModel",
    prefix="transformer.",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    mapping=mapping,
)
