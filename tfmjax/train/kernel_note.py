"""The run header's line on the attention kernel a training step runs on an accelerator, so
that no run takes a slow path without saying so (CPU runs print nothing: ``auto`` there is
XLA or the blockwise twin by length, :data:`tfmjax.kernels.AUTO_TABLE`)."""

from __future__ import annotations

import os

from tfmjax.config import ConfigError, ModelConfig
from tfmjax.config.cudnn_checks import check_cudnn
from tfmjax.kernels import choose_impl
from tfmjax.kernels.dispatch import cudnn_measured_on
from tfmjax.models.checks import auto_may_run_cudnn


def attention_note(cfg: ModelConfig, widths: tuple, platform: str, device_kind: str) -> str:
    """``"attention: ..."``: what the self-attention of a step over a batch's token arrays of
    ``widths`` positions runs on ``platform`` (:func:`tfmjax.models.checks.this_platform`)
    of a ``device_kind`` GPU or TPU, and why. ``""`` on a CPU, or for a model whose
    attention is not one softmax call over one token array (an encoder-decoder's two stacks
    and cross attention have lengths of their own; MLA's latent heads are not the configured
    head width)."""
    if platform == "cpu" or cfg.attention != "softmax" or len(widths) != 1:
        return ""
    (length,) = widths
    impl = cfg.attention_impl
    cudnn_ok = (
        auto_may_run_cudnn(cfg, platform)
        and cudnn_measured_on(device_kind, cfg.head_width)
        and _cudnn_takes(cfg)
    )
    choose = dict(q_len=length, kv_len=length, backend=platform)
    name = choose_impl(impl, **choose, cudnn_ok=cudnn_ok)
    if impl != "auto":
        why = f"model.attention_impl={impl!r}"
    else:
        why = f"'auto' at length {length} on {platform}; tfmjax.kernels.AUTO_TABLE"
        if name != "cudnn" and choose_impl(impl, **choose, cudnn_ok=True) == "cudnn":
            why = f"cuDNN is not taken for this model on {device_kind}; " + why
    if name == "pallas" and platform == "cuda":
        from tfmjax.kernels.mosaic_attention import PALLAS_GPU_DEFAULT, PALLAS_GPU_ENV

        kernel = os.environ.get(PALLAS_GPU_ENV, PALLAS_GPU_DEFAULT)
        name += f" [{kernel} kernels: {PALLAS_GPU_ENV}={kernel}]"
    return f"attention: {name} ({why})"


def _cudnn_takes(cfg: ModelConfig) -> bool:
    """The masks and dtype of ``cfg`` are cuDNN's (:func:`check_cudnn`, for a single-stack
    softmax model)."""
    try:
        check_cudnn(cfg)
    except ConfigError:
        return False
    return True
