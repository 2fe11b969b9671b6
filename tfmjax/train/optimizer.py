"""AdamW with gradient clipping and a weight-decay mask.

Gradient accumulation is not an optimizer wrapper here: the train step scans micro-batches
and sums their gradients before one update (:mod:`tfmjax.train.step`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import optax

__all__ = [
    "NO_DECAY_SUBSTRINGS",
    "current_learning_rate",
    "make_optimizer",
    "weight_decay_mask",
]

# A parameter whose path has a key containing one of these (case-insensitive)
# gets no weight decay: norm gains/offsets, biases, embedding tables, relative
# position biases ("rel_bias" contains "bias"; "pos_embedding", "embedding",
# "token_embed" contain "embed").
NO_DECAY_SUBSTRINGS: tuple[str, ...] = ("norm", "scale", "bias", "embed")


def _key_name(key: Any) -> str:
    """The name of one path entry: DictKey, GetAttrKey, SequenceKey or FlattenedIndexKey."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _decays(path: tuple, leaf: Any) -> bool:
    names = [_key_name(k).lower() for k in path]
    if any(s in n for n in names for s in NO_DECAY_SUBSTRINGS):
        return False
    return len(getattr(leaf, "shape", ())) >= 2


def weight_decay_mask(params: Any) -> Any:
    """Pytree of bools like ``params``: True where AdamW should apply weight decay.

    Rule: a leaf decays iff it is a weight matrix (ndim >= 2, e.g. a Dense
    ``kernel`` [in, out] or DenseGeneral [in, heads, head_dim]) and no key on
    its path contains, case-insensitively, any of ``NO_DECAY_SUBSTRINGS``
    ("norm", "scale", "bias", "embed"). So norms (``*_norm/scale``,
    ``LayerNorm_0/bias``), biases, embeddings (``token_embed/embedding``,
    ``pos_embedding``) and relative-position tables (``rel_bias``) are not
    decayed, nor is any other vector or scalar.
    """
    return jax.tree_util.tree_map_with_path(_decays, params)


def _check_real(name: str, value, lo: float, hi: float, hi_open: bool, lo_open: bool = False):
    if isinstance(value, jax.Array):  # a traced per-run value (tfmjax.train.stacked)
        return
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo)
    ok = ok and (value < hi if hi_open else value <= hi)
    if not ok:
        valid = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be a finite number in {valid}, got {value!r}")


def make_optimizer(
    *,
    schedule: optax.ScalarOrSchedule,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """Global-norm clipping (if ``clip_norm``) then AdamW, masked by ``weight_decay_mask``.

    ``schedule`` is a learning rate or an Optax schedule. Weight decay is
    decoupled (AdamW) and scaled by the learning rate, as in ``optax.adamw``; it may be a
    traced array (one per run, :mod:`tfmjax.train.stacked`): then a decay of 0 adds
    ``0 * param`` where a Python 0 skips the term, the same update.
    """
    if not (callable(schedule) or isinstance(schedule, numbers.Real | jax.Array)):
        raise ValueError(f"schedule must be a float or an optax.Schedule, got {schedule!r}")
    _check_real("weight_decay", weight_decay, 0.0, math.inf, hi_open=True)
    _check_real("b1", b1, 0.0, 1.0, hi_open=True)
    _check_real("b2", b2, 0.0, 1.0, hi_open=True)
    _check_real("eps", eps, 0.0, math.inf, hi_open=True, lo_open=True)
    if clip_norm is not None:
        _check_real("clip_norm", clip_norm, 0.0, math.inf, hi_open=True, lo_open=True)

    parts = [] if clip_norm is None else [optax.clip_by_global_norm(float(clip_norm))]
    parts.append(
        optax.adamw(
            learning_rate=schedule,
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=weight_decay,
            mask=weight_decay_mask,
        )
    )
    return optax.chain(*parts)


def current_learning_rate(schedule: optax.ScalarOrSchedule, step) -> jax.Array:
    """The learning rate at ``step`` (int or int32 array) as a float32 array; jit-safe."""
    lr = schedule(step) if callable(schedule) else schedule
    return jnp.asarray(lr, jnp.float32)
