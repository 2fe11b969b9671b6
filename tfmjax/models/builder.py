"""The family table and :func:`build`, the one place that turns a ModelConfig into a module."""

from __future__ import annotations

from tfmjax.config import ModelConfig
from tfmjax.models.decoder_only import DecoderOnly
from tfmjax.models.encoder_decoder import EncoderDecoder
from tfmjax.models.encoder_only import EncoderOnly

FAMILIES: dict[str, type] = {cls.family: cls for cls in (EncoderDecoder, DecoderOnly, EncoderOnly)}


def build(config: ModelConfig, *, deterministic: bool = True):
    """The Linen module for ``config``; ``deterministic=False`` turns dropout on (training)."""
    return FAMILIES[config.family](config, deterministic=deterministic)
