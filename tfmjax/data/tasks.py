"""Task registry: `make_task(name, **params)` and `TASK_NAMES`.

A name is a built-in task, or your own task class, `"PATH.py:Class"` or
`"package.module:Class"` (imported by :mod:`tfmjax.data.user_data`).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from tfmjax.data.algorithmic import (
    AssociativeRecallTask,
    CopyTask,
    DyckTask,
    InductionHeadTask,
    ReverseTask,
    SortTask,
)
from tfmjax.data.arithmetic import AdditionTask
from tfmjax.data.base import Task
from tfmjax.data.grammar import ScanTask
from tfmjax.data.user_data import task_class
from tfmjax.data.vocab import Vocab

# name -> (class, params fixed by the name)
_REGISTRY: dict[str, tuple[type[Task], dict[str, Any]]] = {
    "copy": (CopyTask, {}),
    "reverse": (ReverseTask, {}),
    "sort": (SortTask, {}),
    "addition": (AdditionTask, {}),
    "addition_reversed": (AdditionTask, {"reversed_answer": True}),
    "scan": (ScanTask, {}),
    "dyck": (DyckTask, {}),
    "associative_recall": (AssociativeRecallTask, {}),
    "induction_head": (InductionHeadTask, {}),
}

TASK_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def _did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def task_defaults(name: str) -> dict[str, Any]:
    """The tunable params of task `name` with their default values."""
    cls, fixed, _ = _lookup(name)
    return _defaults(cls, fixed)


def make_task(name: str, **params: Any) -> Task:
    """Build a task by name; ValueError (one line) for an unknown name or param."""
    return open_task(name, params)[0]


def open_task(
    name: str, params: dict[str, Any], origin: dict | None = None
) -> tuple[Task, dict | None]:
    """``(task, origin record)``: the record says where an imported task class was found
    (None for a built-in task); ``origin``: the record a checkpoint holds, to find it again."""
    cls, fixed, record = _lookup(name, origin)
    params = dict(params)
    allowed = list(_defaults(cls, fixed))
    for key, value in fixed.items():
        if key in params and params.pop(key) != value:
            raise ValueError(f"parameter {key!r} is fixed to {value!r} by task name {name!r}")
    unknown = [p for p in params if p not in allowed]
    if unknown:
        what = "parameter" if len(unknown) == 1 else "parameters"
        hint = _did_you_mean(unknown[0], allowed)
        raise ValueError(
            f"unknown {what} {', '.join(map(repr, unknown))} for task {name!r}{hint} "
            f"(valid parameters: {', '.join(allowed) or 'none'})"
        )
    if record is None:
        return cls(**fixed, **params), None
    try:
        task = cls(**params)
    except Exception as err:  # the user's code: any error is one line
        if isinstance(err, ValueError):
            raise
        raise ValueError(f"building task {name!r} failed: {type(err).__name__}: {err}") from None
    if not isinstance(getattr(task, "vocab", None), Vocab):
        raise ValueError(
            f"task {name!r} has no vocab: its __post_init__ must set self.vocab to a "
            "tfmjax.data.Vocab (object.__setattr__(self, 'vocab', Vocab([...])))"
        )
    return task, record


def _defaults(cls: type[Task], fixed: dict[str, Any]) -> dict[str, Any]:
    """Each tunable field's default (None for a field without one: it must be given)."""
    out = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.init and f.name not in fixed:
            factory = f.default_factory
            out[f.name] = factory() if factory is not dataclasses.MISSING else f.default
            if out[f.name] is dataclasses.MISSING:
                out[f.name] = None
    return out


def _lookup(name: str, origin: dict | None = None):
    """``(class, params fixed by the name, origin record or None)``."""
    if ":" in str(name):
        cls, record = task_class(name, origin)
        return cls, {}, record
    if name not in _REGISTRY:
        hint = _did_you_mean(str(name), TASK_NAMES)
        raise ValueError(f"unknown task {name!r}{hint} (valid tasks: {', '.join(TASK_NAMES)})")
    return (*_REGISTRY[name], None)
