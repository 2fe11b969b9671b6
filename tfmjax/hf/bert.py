"""BERT (``BertForMaskedLM``): learned positions and token types, embedding LayerNorm,
post-norm blocks, exact GELU, the MLM transform and a tied output with a bias.

The pooler and the next-sentence head of ``BertForPreTraining`` checkpoints compute nothing
the MLM logits use: they are not imported (and not exported).
"""

from __future__ import annotations

from tfmjax.config import ModelConfig
from tfmjax.hf.arch import Architecture
from tfmjax.hf.fields import Fields
from tfmjax.hf.mapping import Mapping, flat, linear, same

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu"}
EXPORT_ACTIVATIONS = {v: k for k, v in ACTIVATIONS.items()}


def config_from_hf(f: Fields) -> ModelConfig:
    vocab = f.get("vocab_size")
    f.ignore("hidden_dropout_prob", "attention_probs_dropout_prob")
    f.expect("position_embedding_type", ("absolute",), "absolute")
    f.expect("is_decoder", (False,), False)
    f.expect("add_cross_attention", (False,), False)
    return ModelConfig(
        family="encoder_only",
        vocab_size=vocab,
        d_model=f.get("hidden_size"),
        num_heads=f.get("num_attention_heads"),
        d_ff=f.get("intermediate_size"),
        num_layers=f.get("num_hidden_layers"),
        max_len=f.get("max_position_embeddings"),
        position="learned",
        norm="layernorm",
        norm_position="post",
        norm_eps=f.get("layer_norm_eps", 1e-12),
        activation=f.choose("hidden_act", ACTIVATIONS, "gelu"),
        use_bias=True,
        tie_embeddings=f.expect("tie_word_embeddings", (True,), True),
        type_vocab_size=f.get("type_vocab_size", 2),
        embed_norm=True,
        mlm_head=True,
        output_bias=True,
        bos_id=f.token_id("bos_token_id", vocab, 1),
    )


def config_to_hf(cfg: ModelConfig) -> dict:
    return {
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "max_position_embeddings": cfg.max_len,
        "layer_norm_eps": cfg.norm_eps,
        "hidden_act": EXPORT_ACTIVATIONS.get(cfg.activation, cfg.activation),
        "tie_word_embeddings": cfg.tie_embeddings,
        "type_vocab_size": cfg.type_vocab_size,
        "bos_token_id": cfg.bos_id,
    }


def mapping(cfg: ModelConfig) -> Mapping:
    h = "bert.encoder.layer.{i}."
    layer = []
    for name, ours in (("query", "query"), ("key", "key"), ("value", "value")):
        layer += [
            linear(h + f"attention.self.{name}.weight", f"attention/{ours}/kernel"),
            flat(h + f"attention.self.{name}.bias", f"attention/{ours}/bias"),
        ]
    layer += [
        linear(h + "attention.output.dense.weight", "attention/out/kernel", in_dims=2),
        same(h + "attention.output.dense.bias", "attention/out/bias"),
        same(h + "attention.output.LayerNorm.weight", "attention_norm/scale"),
        same(h + "attention.output.LayerNorm.bias", "attention_norm/bias"),
        linear(h + "intermediate.dense.weight", "mlp/up/kernel"),
        same(h + "intermediate.dense.bias", "mlp/up/bias"),
        linear(h + "output.dense.weight", "mlp/down/kernel"),
        same(h + "output.dense.bias", "mlp/down/bias"),
        same(h + "output.LayerNorm.weight", "mlp_norm/scale"),
        same(h + "output.LayerNorm.bias", "mlp_norm/bias"),
    ]
    e, t = "bert.embeddings.", "cls.predictions.transform."
    top = (
        same(e + "word_embeddings.weight", "embed/token_embed/embedding"),
        same(e + "position_embeddings.weight", "embed/pos_embed/pos_embedding"),
        same(e + "token_type_embeddings.weight", "embed/type_embed/embedding"),
        same(e + "LayerNorm.weight", "embed/embed_norm/scale"),
        same(e + "LayerNorm.bias", "embed/embed_norm/bias"),
        linear(t + "dense.weight", "head/mlm_dense/kernel"),
        same(t + "dense.bias", "head/mlm_dense/bias"),
        same(t + "LayerNorm.weight", "head/mlm_norm/scale"),
        same(t + "LayerNorm.bias", "head/mlm_norm/bias"),
        same("cls.predictions.bias", "head/output_bias"),
    )
    ignored = r"^bert\.pooler\.|^cls\.seq_relationship\.|position_ids$"
    return Mapping(top, (("encoder", cfg.num_layers, tuple(layer)),), ignored)


ARCH = Architecture(
    name="bert",
    model_types=("bert",),
    hf_class="BertForMaskedLM",
    prefix="bert.",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    mapping=mapping,
)
