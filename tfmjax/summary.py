"""Parameter table of a model: ``python -m tfmjax.summary CONFIG.toml [section.key=value ...]``.

Shapes come from ``jax.eval_shape``, so full-size presets cost no memory.
"""
from __future__ import annotations

import sys

import jax
import numpy as np
from flax import traverse_util

from tfmjax.config import ConfigError, ModelConfig, load
from tfmjax.models import build, dummy_batch


def param_shapes(config: ModelConfig) -> dict:
    """Nested ``{name: jax.ShapeDtypeStruct}`` of the model's parameters (no memory used)."""
    model = build(config)
    batch = dummy_batch(config, batch=1, length=min(8, config.max_len))
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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m tfmjax.summary CONFIG.toml [section.key=value ...]", file=sys.stderr)
        return 2
    try:
        experiment = load(argv[0], argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summarize(experiment.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
