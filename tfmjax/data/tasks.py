"""Task registry: `make_task(name, **params)` and `TASK_NAMES`."""

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
    cls, fixed = _lookup(name)
    return {f.name: f.default for f in dataclasses.fields(cls) if f.init and f.name not in fixed}  # type: ignore[arg-type]


def make_task(name: str, **params: Any) -> Task:
    """Build a task by name; ValueError (one line) for an unknown name or param."""
    cls, fixed = _lookup(name)
    allowed = list(task_defaults(name))
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
    return cls(**fixed, **params)


def _lookup(name: str) -> tuple[type[Task], dict[str, Any]]:
    if name not in _REGISTRY:
        hint = _did_you_mean(str(name), TASK_NAMES)
        raise ValueError(f"unknown task {name!r}{hint} (valid tasks: {', '.join(TASK_NAMES)})")
    return _REGISTRY[name]
