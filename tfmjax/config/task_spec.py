"""The forms ``data.task`` takes, parsed: a name, a text file, or a task class to import.

  ``"reverse"``, ``"shakespeare"``      a built-in toy task or corpus (``kind="name"``)
  ``"text:notes/corpus.txt"``            a language model on your own text file (``"text"``)
  ``"tasks/parity.py:ParityTask"``       a task class in a Python file (``"file"``)
  ``"my_package.tasks:ParityTask"``      a task class in an importable module (``"module"``)

A file is told from a module by its form: it ends with ``.py`` or holds a ``/``. Only the
form is checked here; whether the file, module or class exists is checked when the data is
opened (:mod:`tfmjax.data.user_data`).
"""

from __future__ import annotations

import dataclasses
import os

TEXT_PREFIX = "text:"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """``kind``: name, text, file or module; ``target``: the name, the path or the module;
    ``attr``: the class name (file and module only)."""

    kind: str
    target: str
    attr: str = ""


def parse_task_spec(task: str) -> TaskSpec:
    """``data.task`` parsed; ValueError (the reason, one line) for a malformed one."""
    if task.startswith(TEXT_PREFIX):
        path = task[len(TEXT_PREFIX) :]
        if not path.strip():
            raise ValueError('"text:" needs the path of a text file, e.g. "text:corpus.txt"')
        return TaskSpec("text", path)
    if ":" not in task:
        if not task.strip():
            raise ValueError("give a task name, text:PATH or PATH.py:Class")
        return TaskSpec("name", task)
    where, attr = task.rsplit(":", 1)
    if not attr.isidentifier():
        raise ValueError(
            f"{attr!r} after the last ':' is not a class name: write PATH.py:Class or "
            "package.module:Class"
        )
    if where.endswith(".py") or "/" in where or os.sep in where:
        return TaskSpec("file", where, attr)
    if where and all(part.isidentifier() for part in where.split(".")):
        return TaskSpec("module", where, attr)
    raise ValueError(
        f"{where!r} is neither a .py file nor a module name: write PATH.py:Class or "
        "package.module:Class"
    )
