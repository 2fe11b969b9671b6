"""BART (``BartForConditionalGeneration``) and Marian (``MarianMTModel``): the post-norm
encoder-decoder with a shared token table, a logit bias (``final_logits_bias``) and

* BART: learned positions per side, offset by 2 rows, and ``layernorm_embedding`` per side;
* Marian: sinusoidal positions as ``[sin half | cos half]`` (computed, not stored), SiLU.

Older checkpoints also store tied copies (``embed_tokens``, ``lm_head``) and Marian's
position tables; they are constants or duplicates and are not imported (nor exported).
"""

from __future__ import annotations

import dataclasses

from tfmjax.config import ModelConfig
from tfmjax.hf.arch import Architecture
from tfmjax.hf.fields import Fields
from tfmjax.hf.mapping import Mapping, Rule, flat, linear, same

ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "swish": "silu"}
ACTIVATIONS.update(silu="silu")
EXPORT_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "swish"}
TRAINING_ONLY = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "init_std",
    "classif_dropout",
    "num_hidden_layers",  # an alias of encoder_layers in old configs
)


def _same_both_sides(f: Fields, encoder: str, decoder: str) -> int:
    value = f.get(encoder)
    if f.get(decoder, value) != value:
        f.refuse(decoder, f.raw[decoder], f"tfmjax needs it equal to {encoder}={value}")
    return value


def _common(f: Fields) -> dict:
    vocab = f.get("vocab_size")
    f.ignore(*TRAINING_ONLY)
    f.expect("is_encoder_decoder", (True,), True)
    f.expect("is_decoder", (False,), False)
    f.expect("add_bias_logits", (False,), False)
    f.expect("normalize_before", (False,), False)
    f.expect("add_final_layer_norm", (False,), False)
    layers, decoder_layers = f.get("encoder_layers"), f.get("decoder_layers")
    return dict(
        family="encoder_decoder",
        vocab_size=vocab,
        d_model=f.get("d_model"),
        num_heads=_same_both_sides(f, "encoder_attention_heads", "decoder_attention_heads"),
        d_ff=_same_both_sides(f, "encoder_ffn_dim", "decoder_ffn_dim"),
        num_layers=layers,
        num_decoder_layers=None if decoder_layers == layers else decoder_layers,
        max_len=f.get("max_position_embeddings"),
        norm="layernorm",
        norm_position="post",
        norm_eps=1e-5,
        activation=f.choose("activation_function", ACTIVATIONS, "gelu"),
        use_bias=True,
        tie_embeddings=f.get("tie_word_embeddings", True),
        scale_embeddings=f.get("scale_embedding", False),
        output_bias=True,
        bos_id=f.token_id("decoder_start_token_id", vocab, 1),
    )


def bart_from_hf(f: Fields) -> ModelConfig:
    f.expect("normalize_embedding", (True,), True)
    f.expect("static_position_embeddings", (False,), False)
    f.expect("extra_pos_embeddings", (2,), 2)
    return ModelConfig(
        **_common(f),
        position="learned",
        position_offset=2,
        per_side_embeddings=True,
        embed_norm=True,
    )


def marian_from_hf(f: Fields) -> ModelConfig:
    f.expect("share_encoder_decoder_embeddings", (True,), True)
    f.expect("normalize_embedding", (False,), False)
    f.expect("static_position_embeddings", (True,), True)
    f.ignore("extra_pos_embeddings")
    common = _common(f)
    f.expect("decoder_vocab_size", (common["vocab_size"], None))
    return ModelConfig(**common, position="sinusoidal", sinusoidal_layout="half_split")


def _to_hf(cfg: ModelConfig, model_type: str) -> dict:
    return {
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "encoder_attention_heads": cfg.num_heads,
        "decoder_attention_heads": cfg.num_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "encoder_layers": cfg.num_layers,
        "decoder_layers": cfg.decoder_layers,
        "max_position_embeddings": cfg.max_len,
        "activation_function": EXPORT_ACTIVATIONS.get(cfg.activation, cfg.activation),
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_embedding": cfg.scale_embeddings,
        "decoder_start_token_id": cfg.bos_id,
        "is_encoder_decoder": True,
    }


def bart_to_hf(cfg: ModelConfig) -> dict:
    return _to_hf(cfg, "bart")


def marian_to_hf(cfg: ModelConfig) -> dict:
    return dict(_to_hf(cfg, "marian"), decoder_vocab_size=cfg.vocab_size)


def _attention(hf: str, ours: str) -> list[Rule]:
    rules = []
    for p, n in (("q", "query"), ("k", "key"), ("v", "value")):
        rules += [linear(f"{hf}.{p}_proj.weight", f"{ours}/{n}/kernel")]
        rules += [flat(f"{hf}.{p}_proj.bias", f"{ours}/{n}/bias")]
    rules += [linear(f"{hf}.out_proj.weight", f"{ours}/out/kernel", in_dims=2)]
    rules += [same(f"{hf}.out_proj.bias", f"{ours}/out/bias")]
    return rules


def _norm(hf: str, ours: str) -> list[Rule]:
    return [same(f"{hf}.weight", f"{ours}/scale"), same(f"{hf}.bias", f"{ours}/bias")]


def _layer(side: str, cross: bool) -> tuple[Rule, ...]:
    h = f"model.{side}.layers.{{i}}."
    rules = _attention(h + "self_attn", "attention") + _norm(
        h + "self_attn_layer_norm", "attention_norm"
    )
    if cross:
        rules += _attention(h + "encoder_attn", "cross_attention")
        rules += _norm(h + "encoder_attn_layer_norm", "cross_attention_norm")
    rules += [linear(h + "fc1.weight", "mlp/up/kernel"), same(h + "fc1.bias", "mlp/up/bias")]
    rules += [linear(h + "fc2.weight", "mlp/down/kernel"), same(h + "fc2.bias", "mlp/down/bias")]
    return tuple(rules + _norm(h + "final_layer_norm", "mlp_norm"))


def mapping(cfg: ModelConfig) -> Mapping:
    logit_bias = Rule(
        ("final_logits_bias",),
        ("head/output_bias",),
        lambda a, s: [a[0].reshape(s[0])],
        lambda a: [a[0].reshape(1, -1)],
    )
    top = [same("model.shared.weight", "embed/token_embed/embedding"), logit_bias]
    if cfg.position == "learned":
        top += [same("model.encoder.embed_positions.weight", "embed/pos_embed/pos_embedding")]
        top += [
            same("model.decoder.embed_positions.weight", "embed/decoder_pos_embed/pos_embedding")
        ]
    if cfg.embed_norm:
        top += _norm("model.encoder.layernorm_embedding", "embed/embed_norm")
        top += _norm("model.decoder.layernorm_embedding", "embed/decoder_embed_norm")
    ignored = r"embed_tokens\.weight$"
    if cfg.tie_embeddings:
        ignored += r"|^lm_head\.weight$"
    else:
        top += [linear("lm_head.weight", "head/lm_head/kernel")]
    if cfg.position == "sinusoidal":
        ignored += r"|embed_positions\.weight$"
    stacks = (
        ("encoder", cfg.num_layers, _layer("encoder", cross=False)),
        ("decoder", cfg.decoder_layers, _layer("decoder", cross=True)),
    )
    return Mapping(tuple(top), stacks, ignored)


BART = Architecture(
    name="bart",
    model_types=("bart",),
    hf_class="BartForConditionalGeneration",
    prefix="model.",
    config_from_hf=bart_from_hf,
    config_to_hf=bart_to_hf,
    mapping=mapping,
)
MARIAN = dataclasses.replace(
    BART,
    name="marian",
    model_types=("marian",),
    hf_class="MarianMTModel",
    config_from_hf=marian_from_hf,
    config_to_hf=marian_to_hf,
)
