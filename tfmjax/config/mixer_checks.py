"""The checks of the recurrent self-mixers ``model.attention = "retention"`` (RetNet, Sun et
al. 2023), ``"selective_scan"`` (Mamba, Gu & Dao 2023) and ``"rwkv"`` (RWKV-4, Peng et al.
2023): each option that does not apply is refused in one ConfigError line naming the field.

All are causal only: an encoder_only model cannot use them; an encoder_decoder model uses
them as the decoder's self-mixer while its encoder keeps softmax self-attention (and
cross-attention stays softmax attention). rwkv brings its channel-mix as the feed-forward of
those blocks, so it refuses the options of another feed-forward (a mixture of experts, an
activation other than the channel-mix's ReLU, which it squares).
"""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import no_sparse_pattern, require
from tfmjax.config.choices import CAUSAL_ONLY_ATTENTIONS

# Positions each mixer cannot take: score biases (no score matrix over keys to add them to)
# and, for the selective scan (no queries or keys), RoPE. Retention takes RoPE: RetNet's
# own rotation of q and k.
REFUSED_POSITIONS = {
    "retention": ("alibi", "relative", "fire"),
    "selective_scan": ("rope", "alibi", "relative", "fire"),
    "rwkv": ("rope", "alibi", "relative", "fire"),  # no queries; order from shift and decay
}
DEFAULTS = {"ssm_state": 16, "ssm_expand": 2, "ssm_conv": 4}


def check_recurrent_mixer(cfg: Any) -> None:
    """The fields of a :class:`~tfmjax.config.model.ModelConfig` that a recurrent mixer
    cannot take, and the ``ssm_*`` fields outside ``selective_scan``."""
    name = cfg.attention
    if name != "selective_scan":
        for field, default in DEFAULTS.items():
            value = getattr(cfg, field)
            require(value == default, f"model.{field}", value, "applies to selective_scan only")
    if name not in CAUSAL_ONLY_ATTENTIONS:
        return
    what = f"model.attention={name!r} is causal only"
    require(
        cfg.family != "encoder_only",
        "model.attention",
        name,
        f"{what}: an encoder_only model needs a bidirectional self-attention (softmax, mla, "
        "linear, nystrom, linformer)",
    )
    require(
        cfg.position not in REFUSED_POSITIONS[name],
        "model.position",
        cfg.position,
        f"model.attention={name!r} cannot take it: use one of "
        + ", ".join(
            p
            for p in ("sinusoidal", "learned", "rope", "abacus", "none")
            if p not in REFUSED_POSITIONS[name]
        ),
    )
    no_sparse_pattern(cfg, name)
    if name == "retention":
        require(
            cfg.num_kv_heads in (None, cfg.num_heads),
            "model.num_kv_heads",
            cfg.num_kv_heads,
            "retention has one key/value head per query head: leave it unset",
        )
    else:
        require(
            cfg.num_kv_heads is None,
            "model.num_kv_heads",
            cfg.num_kv_heads,
            f"{name} has no heads: leave it unset",
        )
    if name == "rwkv":
        _check_channel_mix(cfg)
    if cfg.family == "decoder_only":
        require(
            cfg.attention_impl == "auto",
            "model.attention_impl",
            cfg.attention_impl,
            f"picks a softmax attention kernel; a decoder_only model with {name} has none: "
            "leave it 'auto'",
        )


def _check_channel_mix(cfg: Any) -> None:
    """rwkv's blocks take its channel-mix (squared ReLU) as their feed-forward."""
    require(
        cfg.activation == "relu",
        "model.activation",
        cfg.activation,
        "model.attention='rwkv' brings its channel-mix feed-forward, relu(W_k x)^2: set 'relu'",
    )
    require(
        cfg.moe_experts == 0,
        "model.moe_experts",
        cfg.moe_experts,
        "model.attention='rwkv' brings its channel-mix feed-forward, not a mixture: set 0",
    )
