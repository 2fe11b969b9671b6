"""The checks of ``model.attention_impl = "cudnn"``: what cuDNN's fused attention
(:mod:`tfmjax.kernels.cudnn_attention`) cannot do, each refused in one ConfigError line."""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import require


def check_cudnn(cfg: Any) -> None:
    """Each option cuDNN cannot take, refused in one line naming the field
    (``model.position = "relative"`` is refused by ModelConfig's head and position
    checks). ``cfg`` is a :class:`tfmjax.config.model.ModelConfig`."""
    use = "use model.attention_impl 'auto', 'pallas' or 'xla'"
    cannot = [
        ("position", cfg.position == "alibi", "ALiBi distance biases"),
        ("position", cfg.position == "fire", "FIRE's dense bias"),
        ("attention", cfg.attention == "mla", "MLA's latent keys (shared RoPE features)"),
        ("attention_stride", cfg.attention_stride is not None, "strided patterns"),
        ("global_tokens", cfg.global_tokens > 0, "global-token patterns"),
        ("random_blocks", cfg.random_blocks > 0, "BigBird's random blocks"),
        (
            "window",
            cfg.window is not None and cfg.family != "decoder_only",
            "a sliding window on the non-causal (encoder) cfg-attention: its window is one-sided",
        ),
    ]
    for name, refused, what in cannot:
        require(
            not refused,
            f"model.{name}",
            getattr(cfg, name),
            f"model.attention_impl='cudnn' (cuDNN fused attention) cannot take {what}; " + use,
        )
    require(
        cfg.dtype == "bfloat16",
        "model.dtype",
        cfg.dtype,
        "model.attention_impl='cudnn' (cuDNN fused attention) has no float32 kernel: set "
        "model.dtype='bfloat16', or " + use,
    )
    require(
        cfg.head_width % 8 == 0 and cfg.head_width <= 256,
        "model.head_dim",
        cfg.head_width,
        "model.attention_impl='cudnn' needs a head width that is a multiple of 8 and at "
        "most 256 (128 before Hopper GPUs); " + use,
    )
