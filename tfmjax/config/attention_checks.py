"""The checks of ``model.attention = "mla"`` and ``"linear"`` (moved out of
:mod:`tfmjax.config.model` to keep it small): the options that fit each, one ConfigError line."""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import no_sparse_pattern, require


def check_mla_and_linear(cfg: Any) -> None:
    """MLA and linear attention: the options that fit each (one ConfigError line)."""
    if cfg.attention == "mla":
        require(
            cfg.num_kv_heads in (None, cfg.num_heads),
            "model.num_kv_heads",
            cfg.num_kv_heads,
            "model.attention='mla' compresses keys and values into its latent "
            "(model.kv_rank) instead of sharing heads: leave num_kv_heads unset",
        )
        if cfg.position == "rope":
            require(
                cfg.mla_rope_dim % 2 == 0 and 0 < cfg.mla_rope_dim < cfg.head_width,
                "model.rope_dim",
                cfg.rope_dim,
                f"must be even and in (0, head width {cfg.head_width})",
            )
        else:
            require(
                cfg.rope_dim in (None, 0),
                "model.rope_dim",
                cfg.rope_dim,
                "decoupled RoPE features need model.position='rope'",
            )
    elif cfg.kv_rank is not None or cfg.q_rank is not None or cfg.rope_dim is not None:
        unused = "kv_rank" if cfg.kv_rank is not None else "q_rank"
        unused = "rope_dim" if cfg.rope_dim is not None else unused
        require(False, f"model.{unused}", getattr(cfg, unused), "applies to model.attention='mla'")
    if cfg.attention == "linear":
        require(
            cfg.position not in ("alibi", "relative", "fire"),
            "model.position",
            cfg.position,
            "linear attention has no score matrix to add a position bias to: use "
            "sinusoidal, learned, rope or none",
        )
        no_sparse_pattern(cfg, "linear")
