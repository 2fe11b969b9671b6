"""Interpretability: take trained models apart, both families, under ``jax.jit``.

- :mod:`~tfmjax.interp.hooked`: ``run_with_cache``, ``run_with_patches``, ``hook_shapes``
  over the hook points of :mod:`tfmjax.layers.hooks` (TransformerLens names with an
  ``encoder.``/``decoder.`` prefix).
- :mod:`~tfmjax.interp.patching`: activation-patching sweeps that compile once, attribution
  patching, metrics.
- :mod:`~tfmjax.interp.lens`: TransformerLens's cache helpers and short names
  (``cache["pattern", 0]``, ``cache.decompose_resid()``, ...); :mod:`~tfmjax.interp.folding`:
  the final norm folded into the unembedding, as TransformerLens's ``fold_ln`` does.
- :mod:`~tfmjax.interp.attribution`: direct logit attribution.
- :mod:`~tfmjax.interp.circuits`: QK/OV circuits as factored matrices, copying and
  composition scores.
- :mod:`~tfmjax.interp.heads`: previous-token, duplicate-token and induction scores.
- :mod:`~tfmjax.interp.sae`: sparse autoencoders on the residual stream.
- :mod:`~tfmjax.interp.plots`: PNG figures; :mod:`~tfmjax.interp.cli`: ``python -m
  tfmjax.interp WORKDIR COMMAND``.
"""

from tfmjax.interp.attribution import logit_attribution, residual_parts
from tfmjax.interp.folding import fold_final_norm
from tfmjax.interp.heads import head_scores
from tfmjax.interp.hooked import (
    ActivationCache,
    hook_shapes,
    mean_ablate,
    replace,
    run_with_cache,
    run_with_patches,
)
from tfmjax.interp.patching import PatchSweep, attribution_patch, patch_sweep

__all__ = [
    "ActivationCache",
    "PatchSweep",
    "attribution_patch",
    "fold_final_norm",
    "head_scores",
    "hook_shapes",
    "logit_attribution",
    "mean_ablate",
    "patch_sweep",
    "replace",
    "residual_parts",
    "run_with_cache",
    "run_with_patches",
]
