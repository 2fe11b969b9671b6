"""Every config key with its type, value and help; the tasks and the presets.

python -m tfmjax.config.explain                          # the defaults
python -m tfmjax.config.explain configs/reverse.toml     # the values this experiment uses
python -m tfmjax.config.explain configs/reverse.toml model.preset=gpt2-small
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from tfmjax.config.errors import ConfigError
from tfmjax.config.fields import help_of
from tfmjax.config.loading import load
from tfmjax.config.presets import PRESETS
from tfmjax.config.sections import SECTIONS, Experiment
from tfmjax.config.task_spec import parse_task_spec
from tfmjax.data import TASK_NAMES, task_defaults
from tfmjax.data.text import CORPORA, TextParams
from tfmjax.data.user_data import GUIDE


def _type_name(hint) -> str:
    args = typing.get_args(hint)
    if args:
        return " | ".join("none" if a is type(None) else a.__name__ for a in args)
    return getattr(hint, "__name__", str(hint))


def keys_table(experiment: Experiment) -> str:
    """``section.key  type  value  help`` for every field of every section (the help sits
    beside each field, in its metadata)."""
    rows = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        values = getattr(experiment, section)
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            rows.append(
                (
                    key,
                    _type_name(hints[f.name]),
                    repr(getattr(values, f.name)),
                    help_of(f),
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        f"{k:<{widths[0]}}  {t:<{widths[1]}}  {v:<{widths[2]}}  {h}" for k, t, v, h in rows
    )


def tasks_table(own: str = "") -> str:
    """Each task with its parameters' defaults (set them in ``[data.task_params]``); ``own``:
    a config's own task or text (``PATH.py:Class``, ``text:PATH``), listed last."""
    lines = []
    for name in TASK_NAMES:
        params = ", ".join(f"{k}={v!r}" for k, v in task_defaults(name).items())
        lines.append(f"{name:<20} {params}")
    text = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(TextParams))
    for name in CORPORA:
        lines.append(f"{name:<20} (text) {text}")
    kind = parse_task_spec(own).kind if own else "name"
    if kind == "text":
        lines.append(f"{own:<20} (your text) {text}")
    elif kind != "name":
        try:
            params = ", ".join(f"{k}={v!r}" for k, v in task_defaults(own).items())
        except ValueError as err:
            params = f"cannot be loaded here: {err}"
        lines.append(f"{own:<20} (your task) {params}")
    lines.append(f"{'(your own)':<20} text:PATH, PATH.py:Class or package.module:Class ({GUIDE})")
    return "\n".join(lines)


def presets_table() -> str:
    """Each preset with its defining fields (``model.preset = NAME``)."""
    keys = ("family", "d_model", "num_heads", "num_layers", "position", "activation")
    return "\n".join(
        f"{name:<14} " + ", ".join(f"{k}={spec[k]}" for k in keys if k in spec)
        for name, spec in PRESETS.items()
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfmjax.config.explain",
        description=__doc__.splitlines()[0],
        epilog="Overrides are section.key=value, e.g. train.steps=500 or "
        "data.task_params.max_len=8.",
    )
    parser.add_argument("config", nargs="?", help="experiment TOML (default: the defaults)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_intermixed_args(argv)
    try:
        experiment = load(args.config, args.overrides) if args.config else Experiment()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"config keys ({args.config or 'defaults'}):\n{keys_table(experiment)}\n")
    print(f"tasks (data.task, data.task_params):\n{tasks_table(experiment.data.task)}\n")
    print(f"presets (model.preset):\n{presets_table()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
