"""The checks of ``model.attention = "linformer"`` (Wang et al. 2020) beyond those of every
bidirectional-only attention (:mod:`tfmjax.config.nystrom_checks`: a decoder_only model
refuses it, an encoder_decoder uses it in the encoder, no score-bias positions, no sparse
patterns): its own fields, each refused in one ConfigError line naming the field.
"""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import require

DEFAULT_RANK = 8


def check_linformer(cfg: Any) -> None:
    """``linformer_rank`` and ``linformer_share_kv``: left at their defaults outside
    linformer; with it, ``1 <= linformer_rank <= max_len``."""
    if cfg.attention != "linformer":
        require(
            cfg.linformer_rank == DEFAULT_RANK,
            "model.linformer_rank",
            cfg.linformer_rank,
            "applies to model.attention='linformer' only",
        )
        require(
            not cfg.linformer_share_kv,
            "model.linformer_share_kv",
            cfg.linformer_share_kv,
            "applies to model.attention='linformer' only",
        )
        return
    require(
        0 < cfg.linformer_rank <= cfg.max_len,
        "model.linformer_rank",
        cfg.linformer_rank,
        f"must be in 1..model.max_len={cfg.max_len} (keys and values are projected from "
        "max_len positions to this many rows)",
    )
