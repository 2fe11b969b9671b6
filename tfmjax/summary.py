"""Parameter table of a model: ``python -m tfmjax.summary CONFIG.toml [section.key=value ...]``.

Shapes come from ``jax.eval_shape`` (:mod:`tfmjax.models.summary`), so full-size presets cost
no memory.
"""
from __future__ import annotations

import sys

from tfmjax.config import ConfigError, load
from tfmjax.models.summary import count_params, param_shapes, summarize

__all__ = ["count_params", "main", "param_shapes", "summarize"]


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
