"""Llama (``LlamaForCausalLM``): RoPE (half-split layout), RMSNorm, SwiGLU, GQA/MQA.

torch ``Linear`` weights are ``[out, in]``; query heads are ``[N*H]`` rows, head-major.
"""

from __future__ import annotations

from tfmjax.config import ModelConfig
from tfmjax.hf.arch import Architecture
from tfmjax.hf.fields import Fields
from tfmjax.hf.mapping import Mapping, flat, linear, same

ACTIVATIONS = {"silu": "swiglu", "gelu": "geglu"}
EXPORT_ACTIVATIONS = {v: k for k, v in ACTIVATIONS.items()}


def _rope_theta(f: Fields) -> float:
    """``rope_parameters`` (transformers v5) or ``rope_theta`` + ``rope_scaling`` (v4)."""
    f.expect("rope_scaling", (None,))
    params = f.get("rope_parameters", None)
    if params is None:
        return float(f.get("rope_theta", 10000.0))
    f.ignore("rope_theta")
    for key, value in params.items():
        if key == "rope_type" and value != "default":
            f.refuse("rope_parameters.rope_type", value, "tfmjax implements only 'default' RoPE")
        if key not in ("rope_type", "rope_theta"):
            f.refuse(f"rope_parameters.{key}", value, "RoPE scaling is not implemented")
    return float(params.get("rope_theta", f.raw.get("rope_theta", 10000.0)))


def config_from_hf(f: Fields) -> ModelConfig:
    d_model, heads, vocab = f.get("hidden_size"), f.get("num_attention_heads"), f.get("vocab_size")
    f.ignore("attention_dropout")
    f.expect("pretraining_tp", (1,), 1)
    head_dim = f.get("head_dim", None)
    return ModelConfig(
        family="decoder_only",
        vocab_size=vocab,
        d_model=d_model,
        num_heads=heads,
        num_kv_heads=f.get("num_key_value_heads", None) or heads,
        head_dim=None if head_dim in (None, d_model // heads) else head_dim,
        d_ff=f.get("intermediate_size"),
        num_layers=f.get("num_hidden_layers"),
        max_len=f.get("max_position_embeddings", 2048),
        position="rope",
        rope_base=_rope_theta(f),
        rope_layout="half_split",
        norm="rmsnorm",
        norm_position="pre",
        norm_eps=f.get("rms_norm_eps", 1e-6),
        activation=f.choose("hidden_act", ACTIVATIONS, "silu"),
        use_bias=False,
        attention_bias=f.get("attention_bias", False),
        mlp_bias=f.get("mlp_bias", False),
        tie_embeddings=f.get("tie_word_embeddings", False),
        bos_id=f.token_id("bos_token_id", vocab, 1),
    )


def config_to_hf(cfg: ModelConfig) -> dict:
    return {
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_width,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "max_position_embeddings": cfg.max_len,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "rms_norm_eps": cfg.norm_eps,
        "hidden_act": EXPORT_ACTIVATIONS.get(cfg.activation, cfg.activation),
        "attention_bias": cfg.attention_uses_bias,
        "mlp_bias": cfg.mlp_uses_bias,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_id,
    }


def mapping(cfg: ModelConfig) -> Mapping:
    a, m = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
    layer = [
        linear(a + "q_proj.weight", "attention/query/kernel"),
        linear(a + "k_proj.weight", "attention/key/kernel"),
        linear(a + "v_proj.weight", "attention/value/kernel"),
        linear(a + "o_proj.weight", "attention/out/kernel", in_dims=2),
        same("model.layers.{i}.input_layernorm.weight", "attention_norm/scale"),
        same("model.layers.{i}.post_attention_layernorm.weight", "mlp_norm/scale"),
        linear(m + "gate_proj.weight", "mlp/gate/kernel"),
        linear(m + "up_proj.weight", "mlp/up/kernel"),
        linear(m + "down_proj.weight", "mlp/down/kernel"),
    ]
    if cfg.attention_uses_bias:
        layer += [flat(a + f"{p}_proj.bias", f"attention/{n}/bias") for p, n in _QKVO]
    if cfg.mlp_uses_bias:
        layer += [flat(m + f"{p}_proj.bias", f"mlp/{p}/bias") for p in ("gate", "up", "down")]
    top = [
        same("model.embed_tokens.weight", "embed/token_embed/embedding"),
        same("model.norm.weight", "head/final_norm/scale"),
    ]
    if not cfg.tie_embeddings:
        top.append(linear("lm_head.weight", "head/lm_head/kernel"))
    # Checkpoints of old transformers versions hold the RoPE frequency buffers.
    return Mapping(tuple(top), (("decoder", cfg.num_layers, tuple(layer)),), r"rotary_emb\.")


_QKVO = (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out"))

ARCH = Architecture(
    name="llama",
    model_types=("llama",),
    hf_class="LlamaForCausalLM",
    prefix="model.",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    mapping=mapping,
)
