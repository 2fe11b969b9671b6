"""Orbax's log records go to ``WORKDIR/checkpoints.log`` while a :class:`Checkpointer` is open.

Orbax reports a failed background save through Python logging: its threads call
``absl.logging.exception`` (the ``absl`` logger, which propagates to the root logger; absl
itself installs a stderr handler there when none exists), and an abandoned asyncio task of
its event loops is reported by asyncio's default exception handler on the ``asyncio`` logger.
Then tensorstore writes that were still running complete and call back into orbax's event
loop, already closed: each prints a ``RuntimeError: Event loop is closed`` traceback through
``sys.unraisablehook`` (about 100 of them for a small model). One failed save printed
hundreds of lines of tracebacks on the terminal this way.

While a checkpointer is open, a filter on those two loggers takes the records that come from
orbax, and a wrapper of ``sys.unraisablehook`` takes those "Event loop is closed" errors (and
any whose traceback runs through orbax), and appends them to the log file of the newest open
checkpointer instead; :class:`Checkpointer` turns the failure itself into one line. Records
and errors from other code pass untouched, and so does everything when no checkpointer is
open.

Orbax's "Requested `tracked_metric`; did not provide metrics." is dropped: a save without
metrics (not an eval step, or the save on SIGTERM) is normal here, and the step is simply not
a candidate for the best checkpoint.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import traceback
import weakref
from pathlib import Path

import orbax

LOG_NAME = "checkpoints.log"
ROUTED_LOGGERS = ("absl", "asyncio")
_ORBAX_DIRS = tuple(
    {os.path.join(d, "") for p in orbax.__path__ for d in (str(p), os.path.realpath(p))}
)
_DROPPED = ("Requested `tracked_metric`; did not provide metrics.",)


def _through_orbax(tb) -> bool:
    return tb is not None and any(
        frame.filename.startswith(_ORBAX_DIRS) for frame in traceback.extract_tb(tb)
    )


def _from_orbax(record: logging.LogRecord) -> bool:
    if record.pathname and record.pathname.startswith(_ORBAX_DIRS):
        return True
    if record.name != "asyncio":  # orbax's own records come from orbax's files
        return False
    if record.exc_info and _through_orbax(record.exc_info[2]):
        return True
    try:
        return "orbax" in record.getMessage()
    except Exception:  # noqa: BLE001  (a record that cannot format is not ours to judge)
        return False


class LogFile(logging.Handler):
    """Appends records to ``path``; never writes to stderr and never raises.

    Records that cannot be written (disk full, directory gone) are kept (the last 10,000)
    and written with the next record or :meth:`flush`, e.g. once a failed save's temporary
    directory is removed and space is free again. The file is created on the first record.
    """

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.written = False  # at least one record reached the file
        self._pending: collections.deque[str] = collections.deque(maxlen=10_000)
        self.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s")
        )

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001
            text = f"{record.levelname} {record.name}: {record.msg!r} (unformattable)"
        self._pending.append(text)
        self._write()

    def write_line(self, text: str) -> None:
        with self.lock:
            self._pending.append(text)
            self._write()

    def flush(self) -> bool:  # type: ignore[override]
        """Write what is pending; True when nothing is left unwritten."""
        with self.lock:
            return self._write()

    def _write(self) -> bool:
        if not self._pending:
            return True
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("\n".join(self._pending) + "\n")
        except OSError:
            return False
        self._pending.clear()
        self.written = True
        return True

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802
        pass  # a log file that cannot be written must not print tracebacks either


class _Router(logging.Filter):
    """Filter on the ``absl`` and ``asyncio`` loggers: orbax's records to the open log file."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._files: list[weakref.ref[LogFile]] = []
        self._installed = False

    def attach(self, log_file: LogFile) -> None:
        with self._lock:
            self._files.append(weakref.ref(log_file))
            if not self._installed:
                for name in ROUTED_LOGGERS:
                    logging.getLogger(name).addFilter(self)
                self._installed = True

    def detach(self, log_file: LogFile) -> None:
        with self._lock:
            self._files = [r for r in self._files if r() not in (None, log_file)]

    def current(self) -> LogFile | None:
        with self._lock:
            self._files = [r for r in self._files if r() is not None]
            return self._files[-1]() if self._files else None

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._files or not _from_orbax(record):
            return True
        if record.msg in _DROPPED:
            return False
        log_file = self.current()
        if log_file is None:
            return True
        log_file.handle(record)
        return False


_ROUTER = _Router()


def _orbax_leftover(unraisable) -> bool:
    """A tensorstore callback into orbax's closed event loop, or anything through orbax."""
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        return True
    return _through_orbax(unraisable.exc_traceback)


class _UnraisableHook:
    """Wraps ``sys.unraisablehook``: orbax's leftovers to the open log file, the rest on."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, unraisable) -> None:
        log_file = _ROUTER.current()
        if log_file is None or not _orbax_leftover(unraisable):
            self.previous(unraisable)
            return
        try:
            text = "".join(
                traceback.format_exception(
                    unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback
                )
            )
            where = unraisable.err_msg or "Exception ignored in"
            log_file.write_line(f"{where}: {unraisable.object!r}\n{text.rstrip()}")
        except Exception:  # noqa: BLE001  (an unraisable hook must not raise)
            pass


def attach(log_file: LogFile) -> None:
    """Route orbax's records to ``log_file`` (the newest attached file wins) until detached."""
    _ROUTER.attach(log_file)
    if not isinstance(sys.unraisablehook, _UnraisableHook):
        sys.unraisablehook = _UnraisableHook(sys.unraisablehook)


def detach(log_file: LogFile) -> None:
    _ROUTER.detach(log_file)
