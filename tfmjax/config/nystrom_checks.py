"""The checks of ``model.attention = "nystrom"`` (Nyströmformer, Xiong et al. 2021) and of
every bidirectional-only attention (``"linformer"`` too, whose own fields
:mod:`tfmjax.config.linformer_checks` checks): each option that does not apply is refused in
one ConfigError line naming the field.

Nyström attention (and Linformer) is bidirectional only, the reverse of the causal-only mixers
(:mod:`tfmjax.config.mixer_checks`): a decoder_only model cannot use it; an encoder_decoder
model uses it in its encoder while the decoder keeps softmax self-attention (and
cross-attention stays softmax attention); an encoder_only model uses it in every block.
"""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import no_sparse_pattern, require
from tfmjax.config.choices import BIDIRECTIONAL_ONLY_ATTENTIONS

DEFAULT_LANDMARKS = 8


def check_nystrom(cfg: Any) -> None:
    """The fields of a :class:`~tfmjax.config.model.ModelConfig` that a bidirectional-only
    attention (nystrom, linformer: :mod:`tfmjax.config.linformer_checks` checks its own
    fields) cannot take, and ``num_landmarks``, ``nystrom_conv`` outside nystrom."""
    if cfg.attention != "nystrom":
        require(
            cfg.num_landmarks == DEFAULT_LANDMARKS,
            "model.num_landmarks",
            cfg.num_landmarks,
            "applies to model.attention='nystrom' only",
        )
        require(
            cfg.nystrom_conv == 0,
            "model.nystrom_conv",
            cfg.nystrom_conv,
            "applies to model.attention='nystrom' only",
        )
    if cfg.attention not in BIDIRECTIONAL_ONLY_ATTENTIONS:
        return
    require(
        cfg.nystrom_conv == 0 or (cfg.nystrom_conv > 0 and cfg.nystrom_conv % 2 == 1),
        "model.nystrom_conv",
        cfg.nystrom_conv,
        "must be 0 (none) or an odd width (the convolution is centred on each token)",
    )
    name = cfg.attention
    require(
        cfg.family != "decoder_only",
        "model.attention",
        name,
        f"model.attention={name!r} is bidirectional only: a decoder_only model needs a causal "
        "self-attention (softmax, mla, linear, retention, selective_scan, rwkv); encoder_decoder "
        "uses it in the encoder",
    )
    require(
        cfg.position not in ("alibi", "relative", "fire"),
        "model.position",
        cfg.position,
        f"model.attention={name!r} has no full score matrix to add a position bias to: use "
        "sinusoidal, learned, rope, abacus or none",
    )
    no_sparse_pattern(cfg, name)
    if cfg.family == "encoder_only":
        require(
            cfg.attention_impl == "auto",
            "model.attention_impl",
            cfg.attention_impl,
            f"picks a softmax attention kernel; an encoder_only model with {name} has none: "
            "leave it 'auto'",
        )
