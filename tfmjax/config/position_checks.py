"""Checks of the length-generalisation position options of ``[model]``: randomized position
sampling (Ruoss et al. 2023), Abacus digit places (McLeish et al. 2024) and FIRE (Li et al.
2023). Each failure is one :class:`ConfigError` line naming the field."""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import one_of, positive, require
from tfmjax.config.choices import ABACUS_COUNTS, POSITION_SAMPLINGS

# Mixers whose decoding cache is a fixed-size state, not one slot per position.
STATE_MIXERS = ("linear", "retention", "selective_scan", "rwkv")


def check_position_options(cfg: Any) -> None:
    """``cfg`` is a :class:`tfmjax.config.model.ModelConfig`."""
    one_of("model.position_sampling", cfg.position_sampling, POSITION_SAMPLINGS)
    one_of("model.abacus_count_from", cfg.abacus_count_from, ABACUS_COUNTS)
    positive(
        "model",
        cfg,
        "max_position",
        "abacus_max_offset",
        "abacus_spread",
        "fire_hidden",
        "fire_threshold",
    )
    if cfg.fire_threshold is not None:
        require(
            cfg.position == "fire",
            "model.fire_threshold",
            cfg.fire_threshold,
            "applies to model.position='fire' (leave it unset otherwise)",
        )
    if cfg.max_position is not None:
        require(
            cfg.position_sampling == "randomized",
            "model.max_position",
            cfg.max_position,
            "applies to model.position_sampling='randomized' (leave it unset otherwise)",
        )
        require(
            cfg.max_position >= cfg.max_len,
            "model.max_position",
            cfg.max_position,
            f"must be >= model.max_len={cfg.max_len}: a row of max_len tokens draws that "
            "many distinct positions",
        )
        require(
            cfg.position != "abacus",
            "model.max_position",
            cfg.max_position,
            "randomized Abacus places are drawn below max_len + abacus_max_offset: set "
            "model.abacus_max_offset instead",
        )
    if cfg.position_sampling == "randomized":
        require(
            cfg.position != "none",
            "model.position_sampling",
            cfg.position_sampling,
            "model.position='none' reads no token positions: use 'ordered'",
        )
    if cfg.randomizes_token_positions:
        require(
            cfg.attention not in STATE_MIXERS,
            "model.position_sampling",
            cfg.position_sampling,
            f"evaluation reads a draw as wide as the KV cache, and model.attention="
            f"{cfg.attention!r} keeps a state, not key slots: use 'ordered'",
        )
        dense = cfg.position == "alibi" and cfg.attention_impl not in ("auto", "xla", "reference")
        require(
            not dense,
            "model.attention_impl",
            cfg.attention_impl,
            "randomized ALiBi distances are a dense bias: use 'auto', 'xla' or 'reference'",
        )
    if cfg.position == "abacus":
        require(
            cfg.digit_first_id is not None and 0 <= cfg.digit_first_id <= cfg.vocab_size - 10,
            "model.digit_first_id",
            cfg.digit_first_id,
            f"model.position='abacus' needs the id of digit 0, with the 9 after it inside "
            f"model.vocab_size={cfg.vocab_size} (the addition tasks: 5)",
        )
        require(
            cfg.abacus_count_from == "start" or cfg.family != "decoder_only",
            "model.abacus_count_from",
            cfg.abacus_count_from,
            "a decoder cannot see where a number it is writing ends: 'end' counts an "
            "encoder's places (encoder_decoder, encoder_only); use 'start'",
        )
    else:
        require(
            cfg.abacus_count_from == "start",
            "model.abacus_count_from",
            cfg.abacus_count_from,
            "applies to model.position='abacus' (leave it unset otherwise)",
        )
        require(
            cfg.digit_first_id is None,
            "model.digit_first_id",
            cfg.digit_first_id,
            "applies to model.position='abacus' (leave it unset otherwise)",
        )
