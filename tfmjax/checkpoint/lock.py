"""One training run per workdir: ``workdir/train.lock``, held while a run trains.

The lock is an advisory ``flock`` on the file, which the kernel drops when its process
ends however it ends (``kill -9`` included); the file's text names the holder (host, PID,
start time) for the refusal line. A second ``train.py`` on the same workdir is refused with
:class:`WorkdirLocked` (one line, exit 2). A lock file that nobody holds was left by a run
that was killed: it is taken over, and ``take`` says so. Readers (``eval.py``, generation,
interp) never take it, so they may run beside a training run.

With several processes, process 0 alone takes the lock (they share one workdir).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from tfmjax.checkpoint.errors import CheckpointError

LOCK_FILE = "train.lock"


class WorkdirLocked(CheckpointError):
    """Another run trains in this workdir now."""


def _holder_text(path: Path) -> str:
    """``PID 123 on host h since 2026-11-25 10:00:00`` from the lock file (or a placeholder)."""
    try:
        info = json.loads(path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["time"]))
        return f"PID {info['pid']} on host {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is still the file at ``path``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class WorkdirLock:
    """``with WorkdirLock(workdir) as lock:`` holds the workdir's training lock.

    ``taken_over``: the holder text of a stale lock this one replaced (None otherwise);
    ``unsupported``: why the filesystem refused to lock at all (the run goes on unlocked).
    """

    def __init__(self, workdir: str | os.PathLike):
        self.path = Path(workdir) / LOCK_FILE
        self.taken_over: str | None = None
        self.unsupported: str | None = None  # why the filesystem refused a lock (run unlocked)
        self._fd: int | None = None

    def take(self) -> WorkdirLock:
        """Take the lock, or raise :class:`WorkdirLocked` naming the process that holds it."""
        while True:
            existed = self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise WorkdirLocked(
                    f"{self.path.parent} is in use by another training run "
                    f"({_holder_text(self.path)}): wait for it to finish, stop it, or give "
                    "this run its own train.workdir"
                ) from None
            except OSError as err:  # a filesystem without flock (some network mounts)
                os.close(fd)
                self.unsupported = f"{self.path.parent} cannot be locked ({err.strerror})"
                return self
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder removed the file as we opened it: take the new one
        if existed and os.fstat(fd).st_size:
            self.taken_over = _holder_text(self.path)
        info = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file, then drop the lock (a rival that opened the old file in
        between sees that it no longer stands in the workdir and opens the new one)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> WorkdirLock:
        return self.take()

    def __exit__(self, *exc) -> None:
        self.release()
