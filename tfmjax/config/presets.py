"""Named model presets as plain data: ``model.preset = "gpt2-small"`` in a config.

Full-size models from the papers, and tiny twins for tests. Each entry of :data:`PRESETS`
holds :class:`~tfmjax.config.model.ModelConfig` fields; :func:`get_preset` builds the config.
"""

from __future__ import annotations

import dataclasses
import difflib

from tfmjax.config.errors import ConfigError
from tfmjax.config.model import ModelConfig

_VASWANI = dict(
    family="encoder_decoder",
    vocab_size=37000,
    max_len=512,
    position="sinusoidal",
    norm="layernorm",
    norm_position="post",
    activation="relu",
    use_bias=True,
    tie_embeddings=True,
    scale_embeddings=True,
)
_GPT2 = dict(
    family="decoder_only",
    position="learned",
    norm="layernorm",
    norm_position="pre",
    activation="gelu",
    use_bias=True,
    tie_embeddings=True,
)
_LLAMA = dict(
    family="decoder_only",
    position="rope",
    norm="rmsnorm",
    norm_position="pre",
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    norm_eps=1e-6,
)
_BERT = dict(
    family="encoder_only",
    position="learned",
    norm="layernorm",
    norm_position="post",
    activation="gelu",
    use_bias=True,
    tie_embeddings=True,
    norm_eps=1e-12,
)
_SWITCH = dict(
    moe_experts=4,
    moe_top_k=1,
    moe_every=2,
    moe_capacity_factor=1.25,
    moe_eval_capacity_factor=0.0,  # evaluate and decode dropless (docs/moe.md)
    moe_aux_loss_weight=0.01,
    moe_z_loss_weight=0.0,
)
_MIXTRAL = dict(
    moe_experts=8,
    moe_top_k=2,
    moe_every=1,
    moe_capacity_factor=0.0,
    moe_aux_loss_weight=0.02,
    moe_z_loss_weight=0.0,
)
_TINY = dict(vocab_size=32, d_model=64, num_heads=4, d_ff=256, num_layers=2, max_len=128)

PRESETS: dict[str, dict] = {
    # Vaswani et al. 2017, Table 3: the original Transformer base and big.
    "vaswani-base": dict(
        _VASWANI, d_model=512, num_heads=8, d_ff=2048, num_layers=6, dropout_rate=0.1
    ),
    "vaswani-big": dict(
        _VASWANI, d_model=1024, num_heads=16, d_ff=4096, num_layers=6, dropout_rate=0.3
    ),
    # GPT-2 small (Radford et al. 2019): 12 layers, 12 heads, width 768, context 1024, vocab 50257.
    "gpt2-small": dict(
        _GPT2, vocab_size=50257, d_model=768, num_heads=12, d_ff=3072, num_layers=12, max_len=1024
    ),
    # RoPE, RMSNorm, SwiGLU, GQA (4 query heads per key/value head), untied output.
    "llama-style": dict(
        _LLAMA,
        vocab_size=32000,
        d_model=2048,
        num_heads=32,
        num_kv_heads=8,
        d_ff=5632,
        num_layers=16,
        max_len=2048,
    ),
    "bert-base": dict(
        _BERT, vocab_size=30522, d_model=768, num_heads=12, d_ff=3072, num_layers=12, max_len=512
    ),
    "tiny-vaswani": dict(_VASWANI, **_TINY),
    "tiny-gpt2": dict(_GPT2, **_TINY),
    "tiny-llama": dict(_LLAMA, **dict(_TINY, d_ff=192), num_kv_heads=2),
    "tiny-bert": dict(_BERT, **_TINY),
    # Multi-head latent attention (DeepSeek-V2): a 32-wide latent and 8 decoupled RoPE
    # features per head cache 40 numbers per token and layer instead of 2 x 4 x 16 = 128.
    "tiny-mla": dict(
        _LLAMA, **dict(_TINY, d_ff=192), attention="mla", kv_rank=32, q_rank=48, rope_dim=8
    ),
    # Linear attention with the elu+1 feature map (Katharopoulos et al. 2020).
    "tiny-linear": dict(_GPT2, **_TINY, attention="linear", feature_map="elu"),
    # Multi-scale retention (RetNet, Sun et al. 2023) in LLaMA-style blocks; RoPE is RetNet's
    # rotation without xPos. Decoding carries a [N,H,H] state per layer, not a KV cache.
    "tiny-retnet": dict(_LLAMA, **dict(_TINY, d_ff=192), attention="retention"),
    # A Mamba mixer (Gu & Dao 2023: expand 2, state 16, conv 4) in place of attention in
    # LLaMA-style blocks; no positions (the scan and convolution are ordered).
    "tiny-mamba": dict(
        _LLAMA, **dict(_TINY, d_ff=192), attention="selective_scan", position="none"
    ),
    # RWKV-4 (Peng et al. 2023): GPT-2-style pre-norm blocks whose attention is the time-mix
    # (per-channel decay, token shift) and whose feed-forward the channel-mix (squared ReLU);
    # no positions, no biases, the paper's ln0 after the embedding, an untied head. Decoding
    # carries [5, D] numbers per layer (WKV state and two shifted inputs), not a KV cache.
    "tiny-rwkv": dict(
        _GPT2,
        **_TINY,
        attention="rwkv",
        position="none",
        activation="relu",
        use_bias=False,
        embed_norm=True,
        tie_embeddings=False,
    ),
    # Nystrom attention (Xiong et al. 2021) in BERT-style blocks: 8 landmarks (segment means
    # of queries and keys) approximate softmax attention in O(T·M).
    "tiny-nystrom": dict(_BERT, **_TINY, attention="nystrom", num_landmarks=8),
    # Linformer (Wang et al. 2020) in BERT-style blocks: keys and values projected along the
    # sequence from max_len = 128 positions to 16 rows, O(T·R) attention.
    "tiny-linformer": dict(_BERT, **_TINY, attention="linformer", linformer_rank=16),
    # Reformer (Kitaev et al. 2020) in GPT-2-style blocks: LSH attention (shared QK, 8
    # buckets, 2 hash rounds, chunks of 16: about max_len / buckets, the paper's choice of
    # buckets per chunk) and reversible residual layers (unrolled, as they must be).
    "tiny-reformer": dict(
        _GPT2,
        **_TINY,
        attention="lsh",
        lsh_buckets=8,
        lsh_rounds=2,
        lsh_chunk=16,
        reversible=True,
        scan_layers=False,
    ),
    # BigBird (Zaheer et al. 2020) in BERT-style blocks: a window of 8 each side, 2 global
    # tokens and 2 random key blocks of 16 per query block of 16.
    "tiny-bigbird": dict(
        _BERT, **_TINY, window=8, global_tokens=2, random_blocks=2, random_block_size=16
    ),
    # ViT (Dosovitskiy et al. 2021) at the size of scikit-learn's 8x8 digits: the image cut
    # into 16 patches of 2x2, each projected to 64, behind a class token; a learned position
    # per slot, pre-norm GELU blocks, the class token read out over 10 classes.
    "tiny-vit": dict(
        family="encoder_only",
        input="patches",
        image_size=8,
        patch_size=2,
        channels=1,
        vocab_size=10,
        d_model=64,
        num_heads=4,
        d_ff=128,
        num_layers=2,
        max_len=17,
        position="learned",
        norm="layernorm",
        norm_position="pre",
        activation="gelu",
        use_bias=True,
        tie_embeddings=False,
    ),
    # Mixtral 8x7B (Jiang et al. 2024): LLaMA-style blocks whose SwiGLU feed-forwards are 8
    # experts, 2 per token, dropless; 46.7B parameters, about 12.9B active per token.
    "mixtral-8x7b": dict(
        _LLAMA,
        vocab_size=32000,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        d_ff=14336,
        num_layers=32,
        max_len=32768,
        rope_base=1e6,
        norm_eps=1e-5,
        **_MIXTRAL,
    ),
    # A small Switch-style decoder (Fedus et al. 2021): every other feed-forward is 4 experts,
    # one per token, capacity factor 1.25 (dropless evaluation), load-balancing loss 0.01.
    "tiny-switch": dict(_GPT2, **_TINY, **_SWITCH),
    # A small Mixtral-style decoder: RoPE, RMSNorm, GQA, 4 SwiGLU experts, top-2, dropless.
    "tiny-mixtral": dict(
        _LLAMA, **dict(_TINY, d_ff=96), num_kv_heads=2, **dict(_MIXTRAL, moe_experts=4)
    ),
}


def get_preset(name: str) -> ModelConfig:
    """The :class:`ModelConfig` of a preset name."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"model.preset={name!r} is unknown{hint}; presets: {', '.join(PRESETS)}")
    return ModelConfig(**PRESETS[name])


def preset(name: str, **overrides) -> ModelConfig:
    """A preset with some fields replaced, e.g. ``preset("tiny-gpt2", position="alibi")``."""
    return dataclasses.replace(get_preset(name), **overrides)
