"""The family table and :func:`build`, the one place that turns a ModelConfig into a module."""

from __future__ import annotations

from tfmjax.config import ModelConfig
from tfmjax.models.decoder_only import DecoderOnly
from tfmjax.models.encoder_decoder import EncoderDecoder
from tfmjax.models.encoder_only import EncoderOnly
from tfmjax.models.image_encoder import PatchEncoder

FAMILIES: dict[str, type] = {cls.family: cls for cls in (EncoderDecoder, DecoderOnly, EncoderOnly)}
# A family's module for another model.input than tokens (the config admits only these pairs).
INPUT_VARIANTS: dict[tuple[str, str], type] = {("encoder_only", "patches"): PatchEncoder}


def build(config: ModelConfig, *, deterministic: bool = True, dropout_rate=None):
    """The Linen module for ``config``; ``deterministic=False`` turns dropout on (training).
    ``dropout_rate``: in place of ``config.dropout_rate``, e.g. a traced per-run rate
    (:mod:`tfmjax.train.stacked`); None: the config's."""
    cls = INPUT_VARIANTS.get((config.family, config.input), FAMILIES[config.family])
    return cls(config, deterministic=deterministic, dropout_rate=dropout_rate)
