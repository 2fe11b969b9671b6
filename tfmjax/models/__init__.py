"""Model families and :func:`build`, the one place that turns a ModelConfig into a module.

Every family implements the interface of :mod:`tfmjax.models.family`; the rest of tfmjax
talks to a model only through it.
"""

from __future__ import annotations

from tfmjax.config import PRESETS, ModelConfig, get_preset, preset
from tfmjax.models.cache import KVCache, kv_cache_bytes
from tfmjax.models.checks import InputError
from tfmjax.models.decoder_only import DecoderOnly
from tfmjax.models.encoder_decoder import EncoderDecoder
from tfmjax.models.encoder_only import EncoderOnly
from tfmjax.models.family import Family

FAMILIES: dict[str, type] = {cls.family: cls for cls in (EncoderDecoder, DecoderOnly, EncoderOnly)}


def build(config: ModelConfig, *, deterministic: bool = True):
    """The Linen module for ``config``; ``deterministic=False`` turns dropout on (training)."""
    return FAMILIES[config.family](config, deterministic=deterministic)


__all__ = [
    "build",
    "FAMILIES",
    "Family",
    "DecoderOnly",
    "EncoderDecoder",
    "EncoderOnly",
    "InputError",
    "KVCache",
    "kv_cache_bytes",
    "PRESETS",
    "get_preset",
    "preset",
]
