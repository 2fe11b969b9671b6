"""T5 (``T5ForConditionalGeneration``), v1.0 and v1.1: relative position bias (learned in the
first layer of each stack, shared by all), unscaled attention logits, RMS-style layer norm
without bias, no biases anywhere, ReLU (v1.0) or gated GELU (v1.1) feed-forward, and the
``d_model**-0.5`` rescale before the tied output (``scale_decoder_outputs``; v1.0).
"""

from __future__ import annotations

from tfmjax.config import ModelConfig
from tfmjax.hf.arch import Architecture
from tfmjax.hf.fields import Fields
from tfmjax.hf.mapping import Mapping, linear, same

FEED_FORWARD = {
    "relu": "relu",
    "gelu": "gelu",
    "gated-gelu": "geglu_tanh",  # transformers runs it with gelu_new, the tanh approximation
    "gated-silu": "swiglu",
}
EXPORT_FEED_FORWARD = {v: k for k, v in FEED_FORWARD.items()}


def config_from_hf(f: Fields) -> ModelConfig:
    d_model, heads, vocab = f.get("d_model"), f.get("num_heads"), f.get("vocab_size")
    f.ignore("dropout_rate", "dense_act_fn", "is_gated_act", "n_positions")
    f.expect("is_encoder_decoder", (True,), True)
    f.expect("is_decoder", (False,), False)
    tie = f.get("tie_word_embeddings", True)
    scale = f.get("scale_decoder_outputs", tie)  # transformers v5; v4 derives it from tie
    if scale and not tie:
        f.refuse("scale_decoder_outputs", scale, "tfmjax rescales only before a tied output")
    layers, d_kv = f.get("num_layers"), f.get("d_kv")
    decoder_layers = f.get("num_decoder_layers", None) or layers
    return ModelConfig(
        family="encoder_decoder",
        vocab_size=vocab,
        d_model=d_model,
        num_heads=heads,
        head_dim=None if d_kv * heads == d_model else d_kv,
        scale_attention=False,
        d_ff=f.get("d_ff"),
        num_layers=layers,
        num_decoder_layers=None if decoder_layers == layers else decoder_layers,
        max_len=f.raw.get("n_positions") or 512,
        position="relative",
        relative_buckets=f.get("relative_attention_num_buckets", 32),
        relative_max_distance=f.get("relative_attention_max_distance", 128),
        norm="rmsnorm",
        norm_position="pre",
        norm_eps=f.get("layer_norm_epsilon", 1e-6),
        activation=f.choose("feed_forward_proj", FEED_FORWARD, "relu"),
        use_bias=False,
        tie_embeddings=tie,
        scale_tied_output=scale,
        bos_id=f.token_id("decoder_start_token_id", vocab, 0),
    )


def config_to_hf(cfg: ModelConfig) -> dict:
    return {
        "model_type": "t5",
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "num_heads": cfg.num_heads,
        "d_kv": cfg.head_width,
        "d_ff": cfg.d_ff,
        "num_layers": cfg.num_layers,
        "num_decoder_layers": cfg.decoder_layers,
        "n_positions": cfg.max_len,
        "relative_attention_num_buckets": cfg.relative_buckets,
        "relative_attention_max_distance": cfg.relative_max_distance,
        "layer_norm_epsilon": cfg.norm_eps,
        "feed_forward_proj": EXPORT_FEED_FORWARD.get(cfg.activation, cfg.activation),
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_decoder_outputs": cfg.scale_tied_output,
        "decoder_start_token_id": cfg.bos_id,
        "is_encoder_decoder": True,
    }


def _attention(hf: str, ours: str) -> list:
    rules = [linear(f"{hf}.{p}.weight", f"{ours}/{n}/kernel") for p, n in _QKV]
    return rules + [linear(f"{hf}.o.weight", f"{ours}/out/kernel", in_dims=2)]


_QKV = (("q", "query"), ("k", "key"), ("v", "value"))


def _layer(side: str, cross: bool, gated: bool) -> tuple:
    h = f"{side}.block.{{i}}.layer."
    rules = _attention(h + "0.SelfAttention", "attention")
    rules += [same(h + "0.layer_norm.weight", "attention_norm/scale")]
    if cross:
        rules += _attention(h + "1.EncDecAttention", "cross_attention")
        rules += [same(h + "1.layer_norm.weight", "cross_attention_norm/scale")]
    ff = f"{h}{2 if cross else 1}."
    if gated:
        rules += [linear(ff + "DenseReluDense.wi_0.weight", "mlp/gate/kernel")]
        rules += [linear(ff + "DenseReluDense.wi_1.weight", "mlp/up/kernel")]
    else:
        rules += [linear(ff + "DenseReluDense.wi.weight", "mlp/up/kernel")]
    rules += [linear(ff + "DenseReluDense.wo.weight", "mlp/down/kernel")]
    return tuple(rules + [same(ff + "layer_norm.weight", "mlp_norm/scale")])


def mapping(cfg: ModelConfig) -> Mapping:
    gated = cfg.activation in ("geglu_tanh", "swiglu")
    bias = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    top = [
        same("shared.weight", "embed/token_embed/embedding"),
        same(f"encoder.{bias}", "encoder_extras/relative_bias/rel_bias"),
        same(f"decoder.{bias}", "decoder_extras/relative_bias/rel_bias"),
        same("encoder.final_layer_norm.weight", "encoder_norm/scale"),
        same("decoder.final_layer_norm.weight", "head/final_norm/scale"),
    ]
    ignored = r"embed_tokens\.weight$"
    if cfg.tie_embeddings:
        ignored += r"|^lm_head\.weight$"
    else:
        top.append(linear("lm_head.weight", "head/lm_head/kernel"))
    stacks = (
        ("encoder", cfg.num_layers, _layer("encoder", False, gated)),
        ("decoder", cfg.decoder_layers, _layer("decoder", True, gated)),
    )
    return Mapping(tuple(top), stacks, ignored)


ARCH = Architecture(
    name="t5",
    model_types=("t5",),
    hf_class="T5ForConditionalGeneration",
    prefix="",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    mapping=mapping,
)
