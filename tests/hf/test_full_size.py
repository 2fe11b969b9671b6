"""Full-size published configs map and build (``jax.eval_shape``: no memory) with their
published parameter counts, and every parameter has a Hugging Face tensor."""

from __future__ import annotations

import math

import pytest

from tfmjax import hf
from tfmjax.hf.api import abstract_params
from tfmjax.hf.mapping import covered_paths

GPT2_SMALL = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "activation_function": "gelu_new",
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
TINYLLAMA_1B = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "max_position_embeddings": 2048,
    "num_attention_heads": 32,
    "num_hidden_layers": 22,
    "num_key_value_heads": 4,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}
BERT_BASE = {
    "model_type": "bert",
    "architectures": ["BertForMaskedLM"],
    "attention_probs_dropout_prob": 0.1,
    "gradient_checkpointing": False,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "transformers_version": "4.6.0.dev0",
    "type_vocab_size": 2,
    "use_cache": True,
    "vocab_size": 30522,
}
T5_BASE = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_ff": 3072,
    "d_kv": 64,
    "d_model": 768,
    "decoder_start_token_id": 0,
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "n_positions": 512,
    "num_heads": 12,
    "num_layers": 12,
    "output_past": True,
    "pad_token_id": 0,
    "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}
BART_BASE = dict(
    model_type="bart", activation_dropout=0.1, activation_function="gelu", add_bias_logits=False,
    add_final_layer_norm=False, attention_dropout=0.1, bos_token_id=0, classif_dropout=0.1,
    classifier_dropout=0.0, d_model=768, decoder_attention_heads=12, decoder_ffn_dim=3072,
    decoder_layerdrop=0.0, decoder_layers=6, decoder_start_token_id=2, dropout=0.1,
    early_stopping=True, encoder_attention_heads=12, encoder_ffn_dim=3072, encoder_layerdrop=0.0,
    encoder_layers=6, eos_token_id=2, forced_eos_token_id=2, gradient_checkpointing=False,
    init_std=0.02, is_encoder_decoder=True, max_position_embeddings=1024, no_repeat_ngram_size=3,
    normalize_before=False, normalize_embedding=True, num_beams=4, num_hidden_layers=6,
    pad_token_id=1, scale_embedding=False, vocab_size=50265, _num_labels=3,
)  # fmt: skip
MARIAN_EN_DE = dict(
    model_type="marian", activation_dropout=0.0, activation_function="swish",
    add_bias_logits=False, add_final_layer_norm=False, attention_dropout=0.0, bos_token_id=0,
    classif_dropout=0.0, classifier_dropout=0.0, d_model=512, decoder_attention_heads=8,
    decoder_ffn_dim=2048, decoder_layerdrop=0.0, decoder_layers=6, decoder_start_token_id=58100,
    decoder_vocab_size=58101, dropout=0.1, encoder_attention_heads=8, encoder_ffn_dim=2048,
    encoder_layerdrop=0.0, encoder_layers=6, eos_token_id=0, forced_eos_token_id=0, init_std=0.02,
    is_encoder_decoder=True, max_length=512, max_position_embeddings=512, normalize_before=False,
    normalize_embedding=False, num_beams=4, num_hidden_layers=6, pad_token_id=58100,
    scale_embedding=True, share_encoder_decoder_embeddings=True, static_position_embeddings=True,
    vocab_size=58101, bad_words_ids=[[58100]],
)  # fmt: skip
# Counts as transformers reports them (GPT2LMHeadModel, LlamaForCausalLM, BertForMaskedLM,
# T5ForConditionalGeneration: tied weights once, no pooler).
FULL_SIZE = {
    "gpt2-small": (GPT2_SMALL, 124_439_808),
    "tinyllama-1.1b": (TINYLLAMA_1B, 1_100_048_384),
    "bert-base-uncased": (BERT_BASE, 109_514_298),
    "t5-base": (T5_BASE, 222_903_552),
    # transformers holds final_logits_bias as a buffer (tfmjax: a parameter, + V) and Marian's
    # sinusoidal tables as parameters (tfmjax computes them, - 2 x 512 x 512).
    "bart-base": (BART_BASE, 139_420_416 + 50265),
    "opus-mt-en-de": (MARIAN_EN_DE, 74_410_496 - 2 * 512 * 512 + 58101),
}


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_config_maps_with_the_published_parameter_count(name):
    raw, count = FULL_SIZE[name]
    cfg = hf.config_from_hf(raw)
    abstract = abstract_params(cfg)
    assert sum(math.prod(a.shape) for a in abstract.values()) == count
    arch = hf.architecture_for(cfg)
    assert arch.name == raw["model_type"]
    assert covered_paths(arch.mapping(cfg), abstract) == set(abstract)
