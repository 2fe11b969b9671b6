"""Model families and :func:`build`, the one place that turns a ModelConfig into a module."""
from __future__ import annotations

from tfmjax.config import ModelConfig
from tfmjax.models.decoder_only import DecoderOnly
from tfmjax.models.encoder_decoder import EncoderDecoder
from tfmjax.models.encoder_only import EncoderOnly
from tfmjax.models.presets import PRESETS, get_preset, preset

FAMILIES = {"encoder_decoder": EncoderDecoder, "decoder_only": DecoderOnly,
            "encoder_only": EncoderOnly}


def build(config: ModelConfig, *, deterministic: bool = True):
    """The Linen module for ``config``; ``deterministic=False`` turns dropout on (training)."""
    return FAMILIES[config.family](config, deterministic=deterministic)


def dummy_batch(config: ModelConfig, batch: int = 2, length: int = 8) -> dict:
    """An all-ones int32 batch of the family's shape, for ``init`` and ``eval_shape``."""
    import jax.numpy as jnp
    ones = jnp.ones((batch, length), jnp.int32)
    if config.family == "encoder_decoder":
        return {"inputs": ones, "targets": ones}
    return {"tokens": ones}


__all__ = ["build", "dummy_batch", "DecoderOnly", "EncoderDecoder", "EncoderOnly", "PRESETS",
           "get_preset", "preset"]
