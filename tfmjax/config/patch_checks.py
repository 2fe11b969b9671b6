"""The checks of ``model.input = "patches"`` (images as sequences, ViT; Dosovitskiy et al.
2021): each combination that cannot work is refused in one ConfigError line naming the field.

A patch model is an encoder_only classifier: the image ``[B,H,W,C]`` is cut into
``(image_size / patch_size)^2`` patches, each flattened and projected to ``d_model``, a
learned class token goes first and a learned position is added per slot (or none), and the
class token's final state is read out over ``vocab_size`` classes. So it has no token table
(nothing to tie the output to, no token types, no scaled token embeddings), no decoder, and
only the positions its embedding learns.
"""

from __future__ import annotations

from typing import Any

from tfmjax.config.checks import one_of, require
from tfmjax.config.choices import INPUTS

PATCH_POSITIONS = ("learned", "none")  # a learned position per slot, or none (an ablation)
_IMAGE_FIELDS = {"image_size": None, "patch_size": None, "channels": 1}


def check_patches(cfg: Any) -> None:
    """``model.input`` and the image fields of a :class:`~tfmjax.config.model.ModelConfig`:
    left at their defaults for token input; for patches, a square grid of whole patches, an
    encoder_only family and the options its embedding has."""
    one_of("model.input", cfg.input, INPUTS)
    if cfg.input != "patches":
        for name, default in _IMAGE_FIELDS.items():
            require(
                getattr(cfg, name) == default,
                f"model.{name}",
                getattr(cfg, name),
                "applies to model.input='patches' only",
            )
        return
    require(
        cfg.family == "encoder_only",
        "model.family",
        cfg.family,
        "model.input='patches' reads images with an encoder_only model (bidirectional, one "
        "class token); a decoder has no image to continue",
    )
    for name in ("image_size", "patch_size", "channels"):
        value = getattr(cfg, name)
        require(
            value is not None and value >= 1,
            f"model.{name}",
            value,
            "model.input='patches' needs it: an int >= 1",
        )
    require(
        cfg.image_size % cfg.patch_size == 0,
        "model.patch_size",
        cfg.patch_size,
        f"must divide model.image_size={cfg.image_size} (the image is cut into whole patches)",
    )
    _check_patch_embedding(cfg)


def _check_patch_embedding(cfg: Any) -> None:
    """What the patch embedding and the class-token head take."""
    length = (cfg.image_size // cfg.patch_size) ** 2 + 1
    require(
        cfg.max_len >= length,
        "model.max_len",
        cfg.max_len,
        f"must be >= {length}: the class token and {length - 1} patches of "
        f"{cfg.patch_size}x{cfg.patch_size} in a {cfg.image_size}x{cfg.image_size} image",
    )
    require(
        cfg.position in PATCH_POSITIONS,
        "model.position",
        cfg.position,
        f"model.input='patches' adds a learned position per patch (learned) or none "
        f"(none); use one of {', '.join(PATCH_POSITIONS)}",
    )
    require(
        cfg.position_sampling == "ordered",
        "model.position_sampling",
        cfg.position_sampling,
        "patches sit at fixed places in the image: use ordered",
    )
    for name, off in (
        ("tie_embeddings", False),
        ("scale_embeddings", False),
        ("type_vocab_size", 0),
        ("embed_norm", False),
    ):
        require(
            getattr(cfg, name) == off,
            f"model.{name}",
            getattr(cfg, name),
            f"model.input='patches' has no token embedding table to use it: set {off}",
        )
