"""Full-size presets through jax.eval_shape (no memory), against closed-form parameter counts."""

import pytest

from tfmjax.models import PRESETS, get_preset
from tfmjax.summary import count_params


def mha(D, N, K, H, bias):
    # Multi-head attention: W_Q, W_O are D x NH; W_K, W_V are D x KH (= 4 D^2 for MHA with NH = D).
    return 2 * D * N * H + 2 * D * K * H + (N * H + 2 * K * H + D if bias else 0)


def ffn(D, F, gated, bias):
    return (3 if gated else 2) * D * F + ((2 * F if gated else F) + D if bias else 0)


def norm(D, kind):
    return 2 * D if kind == "layernorm" else D


def closed_form(c):
    D, N, K, H, F, V = c.d_model, c.num_heads, c.kv_heads, c.head_width, c.d_ff, c.vocab_size
    gated = c.activation in ("swiglu", "geglu")
    attn, mlp, ln = mha(D, N, K, H, c.use_bias), ffn(D, F, gated, c.use_bias), norm(D, c.norm)
    total = V * D  # token embedding
    total += c.max_len * D if c.position == "learned" else 0
    total += 0 if c.tie_embeddings else V * D  # untied output projection
    total += ln if c.norm_position == "pre" else 0  # final norm
    encoder_layer = attn + mlp + 2 * ln
    if c.family == "encoder_decoder":
        decoder_layer = 2 * attn + mlp + 3 * ln
        total += c.num_layers * encoder_layer + c.decoder_layers * decoder_layer
        total += ln if c.norm_position == "pre" else 0  # encoder's final norm
        total += 2 * c.relative_buckets * N if c.position == "relative" else 0
    else:
        total += c.num_layers * encoder_layer
        total += c.relative_buckets * N if c.position == "relative" else 0
    return total


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_count_matches_closed_form(name):
    config = get_preset(name)
    assert count_params(config) == closed_form(config)


def test_known_sizes():
    # Reference points: GPT-2 small has 124,439,808 parameters (tied, learned positions);
    # MHA is exactly 4 d^2 without biases (Vaswani et al. 2017).
    assert count_params(get_preset("gpt2-small")) == 124_439_808
    assert mha(512, 8, 8, 64, bias=False) == 4 * 512**2
    assert 60e6 < count_params(get_preset("vaswani-base")) < 66e6  # "65M" in the paper
    assert 200e6 < count_params(get_preset("vaswani-big")) < 215e6  # "213M"


def test_gqa_shrinks_key_value_projections():
    llama = get_preset("llama-style")
    mha_twin = count_params(llama.__class__(**{**llama.__dict__, "num_kv_heads": None}))
    saved = 2 * llama.d_model * (llama.num_heads - llama.kv_heads) * llama.head_width
    assert mha_twin - count_params(llama) == saved * llama.num_layers
