"""Attention kernels: one entry point over several implementations (see docs/design.md,
"Attention kernels").

:func:`attention` (``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]``) and
:func:`choose_impl` live in :mod:`tfmjax.kernels.dispatch`; the implementations in
:mod:`~tfmjax.kernels.reference`, :mod:`~tfmjax.kernels.xla`,
:mod:`~tfmjax.kernels.blockwise`, :mod:`~tfmjax.kernels.pallas_attention` and
:mod:`~tfmjax.kernels.cudnn_attention`; what ``"auto"`` picks in :data:`AUTO_TABLE` (and
:func:`trailing_padding`, the promise that lets it pick cuDNN); the mask rules
in :mod:`~tfmjax.kernels.masks`, linear attention in :mod:`~tfmjax.kernels.linear`.
"""

from tfmjax.kernels.dispatch import (
    AUTO_TABLE,
    BLOCKWISE_MIN_LEN_CPU,
    IMPLS,
    attention,
    choose_impl,
    traced_with_trailing_padding,
    trailing_padding,
)
from tfmjax.kernels.platforms import LOWERING_PLATFORMS, PALLAS_FLAVOUR

__all__ = [
    "attention",
    "choose_impl",
    "trailing_padding",
    "traced_with_trailing_padding",
    "IMPLS",
    "BLOCKWISE_MIN_LEN_CPU",
    "AUTO_TABLE",
    "LOWERING_PLATFORMS",
    "PALLAS_FLAVOUR",
]
