"""Parameter counts and a per-module table of a model config, without memory.

Shapes come from ``jax.eval_shape``, so full-size presets cost nothing. The CLI is
``python -m tfmjax.summary`` (:mod:`tfmjax.summary`).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import traverse_util

from tfmjax.config import ModelConfig
from tfmjax.models.builder import build


def param_shapes(config: ModelConfig) -> dict:
    """Nested ``{name: jax.ShapeDtypeStruct}`` of the model's parameters (no memory used)."""
    model = build(config)
    batch = model.dummy_batch(batch=1, length=min(8, config.max_len))
    return jax.eval_shape(model.init, jax.random.key(0), batch)["params"]


def count_params(config: ModelConfig) -> int:
    """Total number of parameters."""
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(param_shapes(config)))


def summarize(config: ModelConfig, depth: int = 3) -> str:
    """A table with one row per module (grouped to ``depth`` name parts) and the total."""
    flat = traverse_util.flatten_dict(param_shapes(config))
    groups: dict[str, list] = {}
    for path, leaf in flat.items():
        groups.setdefault("/".join(path[:depth]), []).append(("/".join(path[depth:]), leaf))
    rows = []
    for module, leaves in groups.items():
        count = sum(int(np.prod(leaf.shape)) for _, leaf in leaves)
        shapes = ", ".join(f"{name or 'value'} {tuple(leaf.shape)}" for name, leaf in leaves)
        rows.append((module, f"{count:,}", shapes))
    total = sum(int(np.prod(leaf.shape)) for leaf in flat.values())
    rows.append(("total", f"{total:,}", ""))
    widths = [max(len(r[i]) for r in rows + [("module", "params", "shapes")]) for i in range(2)]
    lines = [f"{'module':<{widths[0]}}  {'params':>{widths[1]}}  shapes"]
    lines.append("-" * (widths[0] + widths[1] + 10))
    lines += [f"{m:<{widths[0]}}  {c:>{widths[1]}}  {s}" for m, c, s in rows]
    return "\n".join(lines)
