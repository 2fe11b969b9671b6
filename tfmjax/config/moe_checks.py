"""The checks of the mixture-of-experts fields of ``[model]`` (one ConfigError line each)."""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import require


def check_moe(cfg: Any) -> None:
    """``moe_*`` fields of a :class:`~tfmjax.config.model.ModelConfig`: sizes in range, top-k
    within the experts, whole groups of ``moe_every`` blocks in a scanned stack."""
    require(cfg.moe_experts >= 0, "model.moe_experts", cfg.moe_experts, "must be >= 0 (0 = dense)")
    require(cfg.moe_top_k >= 1, "model.moe_top_k", cfg.moe_top_k, "must be >= 1")
    require(cfg.moe_every >= 1, "model.moe_every", cfg.moe_every, "must be >= 1")
    for name in ("moe_capacity_factor", "moe_aux_loss_weight", "moe_z_loss_weight"):
        value = getattr(cfg, name)
        require(value >= 0.0, f"model.{name}", value, "must be >= 0")
    evaluation = cfg.moe_eval_capacity_factor
    require(
        evaluation is None or evaluation >= 0.0,
        "model.moe_eval_capacity_factor",
        evaluation,
        "must be >= 0 (0 = dropless) or none (the training factor)",
    )
    if cfg.moe_experts == 0:
        return
    require(
        cfg.moe_top_k <= cfg.moe_experts,
        "model.moe_top_k",
        cfg.moe_top_k,
        f"a token cannot choose more than model.moe_experts={cfg.moe_experts} experts",
    )
    if cfg.scan_layers:
        layers = {cfg.num_layers} | {cfg.decoder_layers}
        for n in sorted(layers):
            require(
                n % cfg.moe_every == 0,
                "model.moe_every",
                cfg.moe_every,
                f"must divide the {n} layers of a stack: a scanned stack repeats groups of "
                "moe_every blocks (or set model.scan_layers=false)",
            )
