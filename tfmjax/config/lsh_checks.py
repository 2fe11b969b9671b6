"""The checks of Reformer's two parts (Kitaev et al. 2020): ``model.attention = "lsh"`` and
``model.reversible``; each option that does not apply is refused in one ConfigError line
naming the field."""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import no_sparse_pattern, require

DEFAULTS = {"lsh_buckets": 8, "lsh_rounds": 2, "lsh_chunk": 32, "lsh_seed": 0}


def check_lsh(cfg: Any) -> None:
    """The ``lsh_*`` fields: at their defaults outside lsh; with it, buckets 1 or even,
    rounds and chunk positive; no score-bias positions, no sparse patterns."""
    if cfg.attention != "lsh":
        for field, default in DEFAULTS.items():
            value = getattr(cfg, field)
            require(value == default, f"model.{field}", value, "applies to model.attention='lsh'")
        return
    require(
        cfg.lsh_buckets == 1 or (cfg.lsh_buckets >= 2 and cfg.lsh_buckets % 2 == 0),
        "model.lsh_buckets",
        cfg.lsh_buckets,
        "must be 1 or even (a rotation R [H, buckets/2] hashes to argmax([xR; -xR]))",
    )
    for field in ("lsh_rounds", "lsh_chunk"):
        require(getattr(cfg, field) > 0, f"model.{field}", getattr(cfg, field), "must be > 0")
    require(cfg.lsh_seed >= 0, "model.lsh_seed", cfg.lsh_seed, "must be >= 0")
    require(
        cfg.position not in ("alibi", "relative", "fire"),
        "model.position",
        cfg.position,
        "model.attention='lsh' scores chunks of a sorted row, with no [T,S] score matrix to "
        "add a position bias to: use sinusoidal, learned, rope, abacus or none",
    )
    no_sparse_pattern(cfg, "lsh")
    if cfg.family != "encoder_decoder":
        require(
            cfg.attention_impl == "auto",
            "model.attention_impl",
            cfg.attention_impl,
            f"picks a softmax attention kernel; a {cfg.family} model with lsh has none: "
            "leave it 'auto'",
        )


def check_reversible(cfg: Any) -> None:
    """``model.reversible``: pre-norm blocks without cross-attention, unrolled, dense."""
    if not cfg.reversible:
        return
    why = "reversible layers"
    for ok, field, valid in (
        (
            cfg.family != "encoder_decoder",
            "model.family",
            f"{why} are built for decoder_only and encoder_only (a decoder block with "
            "cross-attention has three sublayers, not the two a reversible pair splits)",
        ),
        (
            cfg.norm_position == "pre",
            "model.norm_position",
            f"{why} need pre-norm: a norm on the residual sum cannot be inverted",
        ),
        (
            not cfg.scan_layers,
            "model.scan_layers",
            f"{why} run their own loop (the backward pass recomputes each layer in "
            "reverse): set model.scan_layers=false",
        ),
        (not cfg.remat, "model.remat", f"{why} already recompute activations: set it false"),
        (
            cfg.moe_experts == 0,
            "model.moe_experts",
            f"{why} recompute the feed-forward, and a mixture's routing losses are not "
            "carried through the recomputation: use dense feed-forwards",
        ),
        (
            cfg.attention != "rwkv",  # the one variant with its own feed-forward
            "model.attention",
            f"{why} pair the attention with the dense feed-forward; rwkv brings its own "
            "channel-mix, whose token shift the pair does not carry: use another attention",
        ),
    ):
        require(ok, field, getattr(cfg, field.split(".")[1]), valid)
