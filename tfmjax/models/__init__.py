"""Model families and :func:`build` (:mod:`tfmjax.models.builder`), the one place that turns
a ModelConfig into a module.

Every family implements the interface of :mod:`tfmjax.models.family`; the rest of tfmjax
talks to a model only through it.
"""

from __future__ import annotations

from tfmjax.config import PRESETS, get_preset, preset
from tfmjax.layers.attention import kv_cache_bytes
from tfmjax.models.builder import FAMILIES, build
from tfmjax.models.cache import KVCache
from tfmjax.models.checks import InputError
from tfmjax.models.decoder_only import DecoderOnly
from tfmjax.models.encoder_decoder import EncoderDecoder
from tfmjax.models.encoder_only import EncoderOnly
from tfmjax.models.family import Family
from tfmjax.models.image_encoder import PatchEncoder

__all__ = [
    "build",
    "FAMILIES",
    "Family",
    "DecoderOnly",
    "EncoderDecoder",
    "EncoderOnly",
    "InputError",
    "PatchEncoder",
    "KVCache",
    "kv_cache_bytes",
    "PRESETS",
    "get_preset",
    "preset",
]
