"""Full-size presets through jax.eval_shape (no memory), against closed-form parameter counts."""

import math

import jax
import pytest

from tfmjax.models import PRESETS, build, get_preset, preset
from tfmjax.summary import count_params


def mha(D, N, K, H, bias):
    # Multi-head attention: W_Q, W_O are D x NH; W_K, W_V are D x KH (= 4 D^2 for MHA with NH = D).
    return 2 * D * N * H + 2 * D * K * H + (N * H + 2 * K * H + D if bias else 0)


def mla(D, N, H, R, Rq, Hr, bias):
    # Multi-head latent attention: W_DKV (D x (R + Hr): latent and shared RoPE key), its RMSNorm
    # (R), W_UK (R x N(H - Hr)), W_UV (R x NH); queries W_DQ (D x Rq), RMSNorm, W_UQ (Rq x NH)
    # or W_Q (D x NH); W_O (NH x D). Biases on the down-projections, W_Q and W_O only.
    kv = D * (R + Hr) + R + R * N * (H - Hr) + R * N * H + ((R + Hr) if bias else 0)
    q = D * Rq + Rq + Rq * N * H + (Rq if bias else 0) if Rq else D * N * H + (N * H if bias else 0)
    return kv + q + N * H * D + (D if bias else 0)


def retention(D, N, H, bias):
    # MHA's projections (one key/value head per query head), the swish gate W_G (D x NH)
    # and the per-head GroupNorm's scale and bias (N x H each).
    return mha(D, N, N, H, bias) + D * N * H + (N * H if bias else 0) + 2 * N * H


def selective_scan(D, P, expand, W):
    # in_proj (D x 2E), conv (W x E + E), x_proj (E x (R + 2P)), dt_proj (R x E + E),
    # A_log (E x P), D_skip (E), out_proj (E x D); E = expand D, R = ceil(D / 16).
    E, R = expand * D, math.ceil(D / 16)
    return D * 2 * E + W * E + E + E * (R + 2 * P) + R * E + E + E * P + E + E * D


def rwkv_time_mix(D, bias):
    # W_r, W_k, W_v, W_o (D x D; biases but on W_k, where one would cancel in the WKV
    # ratio), time_decay, time_first and the three mu's (D each).
    return 4 * D * D + (3 * D if bias else 0) + 5 * D


def rwkv_channel_mix(D, F, bias):
    # W_k (D x F), W_r (D x D), W_v (F x D), their biases, and the two mu's (D each).
    return D * F + D * D + F * D + (F + 2 * D if bias else 0) + 2 * D


def ffn(D, F, gated, bias):
    return (3 if gated else 2) * D * F + ((2 * F if gated else F) + D if bias else 0)


def norm(D, kind):
    return 2 * D if kind == "layernorm" else D


def closed_form(c):
    D, N, K, H, F, V = c.d_model, c.num_heads, c.kv_heads, c.head_width, c.d_ff, c.vocab_size
    gated = c.activation in ("swiglu", "geglu")
    attn, mlp, ln = mha(D, N, K, H, c.use_bias), ffn(D, F, gated, c.use_bias), norm(D, c.norm)
    softmax = attn  # cross-attention, and the encoder's self-attention with a causal mixer
    if c.attention == "mla":  # (self-attention; linear, nystrom have MHA's projections)
        attn = mla(D, N, H, c.latent_kv_rank, c.q_rank, c.mla_rope_dim, c.use_bias)
    if c.attention == "retention":
        attn = retention(D, N, H, c.use_bias)
    if c.attention == "selective_scan":
        attn = selective_scan(D, c.ssm_state, c.ssm_expand, c.ssm_conv)
    encoder_mlp = mlp  # rwkv's channel-mix replaces the feed-forward where it mixes
    if c.attention == "rwkv":
        attn, mlp = rwkv_time_mix(D, c.use_bias), rwkv_channel_mix(D, F, c.use_bias)
    if c.attention == "nystrom":  # plus the skip convolution's kernel W x N, no bias
        attn += c.nystrom_conv * N
    if c.attention == "linformer":  # plus the sequence projections E, F [R, max_len]
        attn += (1 if c.linformer_share_kv else 2) * c.linformer_rank * c.max_len
    if c.attention == "lsh":  # shared QK: no key projection W_K (D x KH) nor its bias
        attn -= D * K * H + (K * H if c.use_bias else 0)
    causal_only = ("retention", "selective_scan", "rwkv")
    encoder_attn = softmax if c.attention in causal_only else attn
    total = V * D  # token embedding
    total += c.max_len * D if c.position == "learned" else 0
    if c.input == "patches":  # no token table: the patch projection, class token, positions
        total = (
            c.patch_dim * D + D + D + ((c.num_patches + 1) * D if c.position == "learned" else 0)
        )
    total += 0 if c.tie_embeddings else V * D  # untied output projection
    total += ln if c.norm_position == "pre" else 0  # final norm
    total += ln * (2 if c.per_side_embeddings else 1) if c.embed_norm else 0
    # A mixture-of-experts layer: E feed-forwards and the router (D x E, no bias), every
    # moe_every-th layer.
    moe_mlp = c.moe_experts * mlp + D * c.moe_experts

    def mixtures(layers):
        return layers // c.moe_every if c.moe_experts else 0

    encoder_layer = attn + mlp + 2 * ln  # (decoder_only: the decoder's layers)
    total += mixtures(c.num_layers) * (moe_mlp - mlp)
    if c.family == "encoder_decoder":
        decoder_layer = 2 * attn + mlp + 3 * ln
        if c.attention in causal_only:
            decoder_layer = attn + softmax + mlp + 3 * ln
        if c.attention in ("nystrom", "linformer"):  # the decoder keeps softmax self-attention
            decoder_layer = 2 * softmax + mlp + 3 * ln
        encoder_layer = encoder_attn + encoder_mlp + 2 * ln
        total += mixtures(c.decoder_layers) * (moe_mlp - mlp)
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


def _tree_count(config) -> int:
    """Parameters in the model's real param tree (``init`` through ``jax.eval_shape``)."""
    model = build(config)
    batch = model.dummy_batch(batch=1, length=8)
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch)["params"]
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))


def _gpt2_small() -> int:
    V, D, L, F, T = 50257, 768, 12, 3072, 1024
    embeddings = V * D + T * D  # tokens (tied with the output) + learned positions
    attention = 4 * (D * D + D)  # W_Q, W_K, W_V, W_O with biases, 12 heads x 64
    mlp = D * F + F + F * D + D
    norms = 2 * (2 * D)  # two LayerNorms (scale, bias) per layer
    return embeddings + L * (attention + mlp + norms) + 2 * D  # + the final LayerNorm


def _vaswani(D, F) -> int:
    V, L = 37000, 6  # shared source/target/output embedding, sinusoidal positions
    attention = 4 * (D * D + D)
    mlp = D * F + F + F * D + D
    encoder_layer = attention + mlp + 2 * (2 * D)
    decoder_layer = 2 * attention + mlp + 3 * (2 * D)  # self- and cross-attention
    return V * D + L * encoder_layer + L * decoder_layer  # post-norm: no final norms


def _llama_style() -> int:
    V, D, L, F = 32000, 2048, 16, 5632
    N, K, H = 32, 8, 64  # 32 query heads, 8 key/value heads, no biases
    attention = D * N * H + 2 * D * K * H + N * H * D
    mlp = 3 * D * F  # SwiGLU: gate, up, down
    norms = 2 * D  # two RMSNorms (scale only) per layer
    return 2 * V * D + L * (attention + mlp + norms) + D  # untied head, final RMSNorm


def _bert_base() -> int:
    # Published BERT-base: 109,482,240 with token-type embeddings (2 x 768), an embedding
    # LayerNorm (2 x 768) and the pooler (768 x 768 + 768), none of which this family has.
    V, D, L, F, T = 30522, 768, 12, 3072, 512
    attention = 4 * (D * D + D)
    mlp = D * F + F + F * D + D
    return V * D + T * D + L * (attention + mlp + 2 * (2 * D))  # post-norm, tied


def _mixtral_8x7b() -> int:
    # Mixtral 8x7B as published (46,702,792,704 parameters in its Hugging Face checkpoint).
    V, D, L, F, E = 32000, 4096, 32, 14336, 8
    N, K, H = 32, 8, 128
    attention = D * N * H + 2 * D * K * H + N * H * D
    experts = E * 3 * D * F + D * E  # 8 SwiGLU experts and the router
    return 2 * V * D + L * (attention + experts + 2 * D) + D


@pytest.mark.parametrize(
    "name, formula, expected",
    [
        ("mixtral-8x7b", _mixtral_8x7b, 46_702_792_704),
        ("gpt2-small", _gpt2_small, 124_439_808),  # the published GPT-2 small count
        ("vaswani-base", lambda: _vaswani(512, 2048), 63_082_496),  # "65M" in the paper
        ("vaswani-big", lambda: _vaswani(1024, 4096), 214_245_376),  # "213M"
        ("llama-style", _llama_style, 852_559_872),
        ("bert-base", _bert_base, 108_888_576),
    ],
)
def test_known_sizes(name, formula, expected):
    """Each full-size preset's real param tree has the count written out by hand from its
    architecture (embeddings, per-layer attention, MLP and norms), not from this file's
    closed form."""
    assert formula() == expected
    assert _tree_count(get_preset(name)) == expected


def test_gqa_shrinks_key_value_projections():
    llama = get_preset("llama-style")
    mha_twin = count_params(llama.__class__(**{**llama.__dict__, "num_kv_heads": None}))
    saved = 2 * llama.d_model * (llama.num_heads - llama.kv_heads) * llama.head_width
    assert mha_twin - count_params(llama) == saved * llama.num_layers


@pytest.mark.parametrize("attention", ["retention", "selective_scan", "rwkv"])
@pytest.mark.parametrize("base", ["tiny-vaswani", "tiny-gpt2"])
def test_recurrent_mixers_match_closed_form(base, attention):
    """Encoder-decoder: the decoder's self-mixer is the recurrent one, the encoder keeps
    softmax self-attention (and cross-attention stays softmax); rwkv's decoder blocks take
    its channel-mix, the encoder's keep the feed-forward."""
    extra = {"activation": "relu"} if attention == "rwkv" else {}
    config = preset(base, attention=attention, num_layers=1, **extra)
    assert count_params(config) == closed_form(config) == _tree_count(config)


@pytest.mark.parametrize("base", ["tiny-nystrom", "tiny-vaswani"])
def test_nystrom_skip_convolution_matches_closed_form(base):
    """The encoder's Nyström attention adds the convolution's W x N kernel (the paper's 33);
    an encoder-decoder's decoder keeps softmax self-attention, without it."""
    config = preset(base, attention="nystrom", nystrom_conv=33, num_layers=1)
    assert count_params(config) == closed_form(config) == _tree_count(config)


@pytest.mark.parametrize("share_kv", [False, True])
@pytest.mark.parametrize("base", ["tiny-linformer", "tiny-vaswani"])
def test_linformer_projections_match_closed_form(base, share_kv):
    """The encoder's Linformer attention adds E and F [R, max_len] (one with E = F); an
    encoder-decoder's decoder keeps softmax self-attention, without them."""
    config = preset(base, attention="linformer", linformer_share_kv=share_kv, num_layers=1)
    assert count_params(config) == closed_form(config) == _tree_count(config)
