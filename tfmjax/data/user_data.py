"""Your own task class or text file: finding it, importing it, and recording where it was.

``data.task`` names it (forms in :mod:`tfmjax.config.task_spec`): ``"PATH.py:Class"`` or
``"package.module:Class"`` for a task, ``"text:PATH"`` for a text file. A relative path is
taken from the working folder; a module is imported as Python would, the working folder
searched last. Every failure is one ``ValueError`` line saying what is wrong and how to fix it.

Where the data came from travels in the checkpoint (its ``task_origin`` asset): the
absolute path of the file (a module's too) and a SHA-256 of its bytes. ``eval.py`` and
generation open that file again, or, if it has moved, the file at the configured path;
:func:`data_change` then says whether its bytes are still the ones the checkpoint recorded
(the checkpoint and training layers refuse a change unless it is accepted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from tfmjax.config.task_spec import TaskSpec, parse_task_spec
from tfmjax.data.base import Task

GUIDE = "docs/own_data.md"  # where the task interface is described


def file_digest(path: Path) -> str:
    """SHA-256 (hex) of the file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def configured_file_digest(task: str) -> str:
    """SHA-256 of the file ``data.task`` names (a task file or ``text:PATH``) as configured,
    ``""`` for other tasks or a missing file."""
    try:
        spec = parse_task_spec(task)
    except ValueError:
        return ""
    path = Path(spec.target).expanduser()
    return file_digest(path) if spec.kind in ("file", "text") and path.is_file() else ""


def _record(task: str, path: Path, **extra: str) -> dict[str, str]:
    return {"task": task, "file": str(path), "sha256": file_digest(path), **extra}


def locate(task: str, spec: TaskSpec, what: str, origin: dict | None) -> Path:
    """The absolute path of the ``what`` file ``spec`` names (``origin``: the record a
    checkpoint holds, preferred over the configured path)."""
    configured = Path(spec.target).expanduser()
    recorded = Path(origin["file"]) if origin and origin.get("file") else None
    if recorded is None:
        if configured.is_file():
            return configured.resolve()
        where = "" if configured.is_absolute() else f" (relative to {os.getcwd()})"
        raise ValueError(
            f"{what} {spec.target!r} of data.task={task!r} does not exist{where}: give the "
            "path of an existing file"
        )
    if recorded.is_file():
        return recorded
    if configured.is_file():
        return configured.resolve()  # moved: data_change says whether its bytes are the same
    raise ValueError(
        f"{what} {recorded} of data.task={task!r}, recorded in the checkpoint, is gone: "
        f"put it back there, or run from a folder where {spec.target} is that same file"
    )


def data_change(recorded: dict | None, current: dict | None) -> str:
    """``""`` when the data a checkpoint recorded (``recorded``, its ``task_origin``) is the
    data opened now (``current``, the record of the file found), or when there is nothing to
    compare (a built-in task, a module without a file); else one line saying what changed."""
    before = (recorded or {}).get("sha256")
    now = (current or {}).get("sha256")
    if not before or not now or before == now:
        return ""
    kind = parse_task_spec(current["task"]).kind
    what = {"text": "text file", "file": "task file"}.get(kind, f"module {current.get('module')}")
    return (
        f"{what} {current['file']} of data.task={current['task']!r} is not the one the "
        f"checkpoint was trained on (sha256 {before[:12]} recorded, {now[:12]} now)"
    )


def unhashable_module(record: dict | None) -> str:
    """One line when ``record`` is a module task whose file could not be hashed (a namespace
    package, a module without a file): its changes cannot be detected. ``""`` otherwise."""
    if not record or "sha256" in record or ":" not in record.get("task", ""):
        return ""
    return (
        f"note: data.task={record['task']!r} is a module without a file to hash: a checkpoint "
        "cannot tell whether it changes later"
    )


def text_file(task: str, origin: dict | None = None) -> tuple[Path, dict[str, str]]:
    """``(path, origin record)`` of the text file of ``data.task = "text:PATH"``."""
    path = locate(task, parse_task_spec(task), "text file", origin)
    return path, _record(task, path)


def found_record(task: str, origin: dict | None = None) -> dict[str, str] | None:
    """The record (path, SHA-256) of the own task or text file ``data.task`` names, found as
    :func:`locate` finds it, before it is read (a module is imported to find its file);
    None for a built-in task or corpus."""
    spec = parse_task_spec(task)
    if spec.kind == "text":
        return text_file(task, origin)[1]
    if spec.kind == "file":
        return _record(task, locate(task, spec, "task file", origin))
    if spec.kind == "module":
        return task_class(task, origin)[1]
    return None


def task_class(task: str, origin: dict | None = None) -> tuple[type[Task], dict[str, str]]:
    """``(class, origin record)`` of ``data.task = "PATH.py:Class"`` or ``"module:Class"``,
    checked to be a concrete :class:`~tfmjax.data.base.Task` dataclass."""
    spec = parse_task_spec(task)
    if spec.kind not in ("file", "module"):
        raise ValueError(f"data.task={task!r} names no task class (PATH.py:Class, module:Class)")
    if spec.kind == "file":
        path = locate(task, spec, "task file", origin)
        module, where = _import_file(path), str(path)
        record = _record(task, path)
    else:
        module = _import_module(task, spec.target, origin)
        where = f"module {spec.target}"
        path = Path(getattr(module, "__file__", None) or "")  # None: a namespace package
        record = _record(task, path, module=spec.target) if path.is_file() else {"task": task}
    return _checked_class(module, spec.attr, where), record


@contextlib.contextmanager
def _searched(folder: str):
    """``folder`` on ``sys.path`` (searched last) while the block runs, unless already there."""
    added = folder not in sys.path
    if added:
        sys.path.append(folder)
    try:
        yield
    finally:
        if added:
            sys.path.remove(folder)


def _import_file(path: Path):
    """The module of a Python file, imported once per distinct content; while it runs, it
    may import the modules beside it, as a script would."""
    name = f"_tfmjax_task_{file_digest(path)[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        with _searched(str(path.parent)):
            spec.loader.exec_module(module)
    except Exception as err:  # the user's code: any error is one line
        del sys.modules[name]
        raise ValueError(f"importing task file {path} failed: {_one_line(err, path)}") from None
    return module


def _import_module(task: str, name: str, origin: dict | None):
    """``importlib.import_module(name)``, the working folder searched after ``sys.path``."""
    try:
        with _searched("" if "" in sys.path else os.getcwd()):
            return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is None or not (name + ".").startswith(err.name + "."):
            raise ValueError(f"importing module {name} failed: {_one_line(err)}") from None
        was = f" (it was {origin['file']} when trained)" if origin and origin.get("file") else ""
        raise ValueError(
            f"no module named {name!r} for data.task={task!r}{was}: install it, or run from "
            "the folder that holds it, or add that folder to PYTHONPATH"
        ) from None
    except Exception as err:  # the user's code: any error is one line
        raise ValueError(f"importing module {name} failed: {_one_line(err)}") from None


def _one_line(err: BaseException, path: Path | None = None) -> str:
    """``Type: message (line N)``, N the last line of ``path`` the traceback passed."""
    text = " ".join(f"{type(err).__name__}: {err}".split())
    lines = [
        f.lineno
        for f in traceback.extract_tb(err.__traceback__)
        if path and f.filename == str(path)
    ]
    if isinstance(err, SyntaxError) and err.lineno:
        lines = [err.lineno]
    return text + (f" (line {lines[-1]})" if lines else "")


def _checked_class(module, attr: str, where: str) -> type[Task]:
    cls = getattr(module, attr, None)
    if cls is None:
        tasks = [n for n, v in vars(module).items() if _is_task_class(v) and v is not Task]
        close = difflib.get_close_matches(attr, tasks, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        listed = f" (tasks there: {', '.join(tasks)})" if tasks else " (it defines no task)"
        raise ValueError(f"{where} has no class {attr!r}{hint}{listed}")
    if not _is_task_class(cls) or cls is Task:
        raise ValueError(
            f"{attr} in {where} is not a task: a task is a subclass of tfmjax.data.Task "
            f"(see {GUIDE})"
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ValueError(f"task {attr} in {where} does not define {missing} (see {GUIDE})")
    if not dataclasses.is_dataclass(cls):
        raise ValueError(
            f"task {attr} in {where} is not a dataclass: decorate it with "
            "@dataclasses.dataclass(frozen=True, kw_only=True), its fields the task's parameters"
        )
    return cls


def _is_task_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, Task)
