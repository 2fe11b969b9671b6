"""The run header's line on the attention kernel a training step runs on an accelerator, so
that no run takes a slow path without saying so (CPU runs print nothing: ``auto`` there is
XLA or the blockwise twin by length, :data:`tfmjax.kernels.AUTO_TABLE`)."""

from __future__ import annotations

import os

from tfmjax.config import ConfigError, ModelConfig
from tfmjax.config.cudnn_checks import check_cudnn
from tfmjax.kernels import choose_impl
from tfmjax.kernels.mosaic_attention import PALLAS_GPU_DEFAULT, PALLAS_GPU_ENV
from tfmjax.models.checks import auto_may_run_cudnn

SOFTMAX_MIXERS = ("softmax", "mla")  # the self-mixers that call tfmjax.kernels.attention


def attention_note(cfg: ModelConfig, length: int, backend: str) -> str:
    """``"attention: ..."``: what the self-attention of a step over ``length`` positions runs
    on ``backend`` (``jax.default_backend()``) and why; ``""`` on a CPU or for a mixer that
    is not softmax attention (its own kernel)."""
    if backend == "cpu" or cfg.attention not in SOFTMAX_MIXERS:
        return ""
    platform = "cuda" if backend == "gpu" else backend
    impl = cfg.attention_impl
    cudnn_ok = auto_may_run_cudnn(cfg, backend) and _cudnn_takes(cfg)
    choose = dict(q_len=length, kv_len=length, backend=platform)
    name = choose_impl(impl, **choose, cudnn_ok=cudnn_ok)
    if impl != "auto":
        why = f"model.attention_impl={impl!r}"
    else:
        why = f"'auto' at length {length} on {platform}; tfmjax.kernels.AUTO_TABLE"
        if name != "cudnn" and choose_impl(impl, **choose, cudnn_ok=True) == "cudnn":
            why = "cuDNN cannot take this model's masks or dtype; " + why
    if name == "pallas" and platform == "cuda":
        kernel = os.environ.get(PALLAS_GPU_ENV, PALLAS_GPU_DEFAULT)
        name += f" [{kernel} kernels: {PALLAS_GPU_ENV}={kernel}]"
    return f"attention: {name} ({why})"


def _cudnn_takes(cfg: ModelConfig) -> bool:
    try:
        check_cudnn(cfg)
    except ConfigError:
        return False
    return True
