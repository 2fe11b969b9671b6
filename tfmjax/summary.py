"""Parameter table of a model: ``python -m tfmjax.summary CONFIG.toml [section.key=value ...]``.

Shapes come from ``jax.eval_shape`` (:mod:`tfmjax.models.summary`), so full-size presets cost
no memory.
"""

from __future__ import annotations

import argparse
import sys

from tfmjax.config import ConfigError, load
from tfmjax.models.summary import count_params, param_shapes, summarize

__all__ = ["count_params", "main", "param_shapes", "summarize"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfmjax.summary",
        description=__doc__.splitlines()[0],
        epilog="A model.preset=NAME override starts the model from that preset (the file's "
        "other [model] keys are dropped); python -m tfmjax.config.explain lists presets.",
    )
    parser.add_argument("config", help="experiment TOML, e.g. configs/reverse.toml")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. model.d_model=128")
    args = parser.parse_intermixed_args(argv)
    try:
        experiment = load(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summarize(experiment.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
