"""The process executor: each run is ``train.py`` in a child process, a pool of them at once.

A pool of ``jobs`` slots (by default one per core this process may use), each slot pinned to
one core (``os.sched_setaffinity`` of the child, where the OS has it), so that runs do not
fight over cores. A child writes its console to ``<workdir>/train.log``.

Signals: children run in sessions of their own, so a Ctrl-C at the terminal reaches the sweep
alone, which forwards it once to every child in flight: each finishes its step, saves and
exits as ``train.py`` does; no new run starts. A second Ctrl-C is forwarded too (children exit
at once, as after a second Ctrl-C of their own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tfmjax

TRAIN_SCRIPT = Path(tfmjax.__file__).resolve().parents[1] / "train.py"
LOG_FILE = "train.log"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclasses.dataclass
class Job:
    """One child: its name, command and workdir; filled in as it runs."""

    name: str
    argv: list[str]  # after ``python train.py``
    workdir: Path
    core: int | None = None
    wall_sec: float = 0.0
    returncode: int | None = None


def default_cores() -> list[int]:
    """The cores this process may run on (all of ``os.cpu_count()`` where unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _pin(pid: int, core: int | None) -> None:
    """Pin the child to ``core``, right after it started (no Python runs between its fork and
    exec: a ``preexec_fn`` would, unsafe in a parent that runs JAX's threads). The child is
    still starting Python then; the threads it starts later (XLA's) inherit the mask."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(ProcessLookupError):  # already gone: nothing to pin
            os.sched_setaffinity(pid, {core})


class _Forwarder:
    """While installed: each SIGINT / SIGTERM is recorded and sent on to every running child,
    once per signal received (a child started just before it is sent it at the next poll)."""

    def __init__(self, running: dict):
        self.running, self.requested, self._previous = running, None, {}
        self.count, self.sent = 0, {}  # signals received; pid -> how many it was sent

    def __enter__(self):
        self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def _handle(self, signum, frame):
        self.requested = self.requested or signum
        self.count += 1
        self.forward()

    def forward(self) -> None:
        for proc, _ in list(self.running.values()):
            while self.sent.get(proc.pid, 0) < self.count and proc.poll() is None:
                proc.send_signal(self.requested)
                self.sent[proc.pid] = self.sent.get(proc.pid, 0) + 1

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def train_command() -> list[str]:
    """What every child runs before its own arguments: ``python train.py --progress lines``."""
    return [sys.executable, str(TRAIN_SCRIPT), "--progress", "lines"]


def _start(job: Job, command: list[str]) -> subprocess.Popen:
    job.workdir.mkdir(parents=True, exist_ok=True)
    with open(job.workdir / LOG_FILE, "a") as log:
        proc = subprocess.Popen(
            [*command, *job.argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep only
        )
    _pin(proc.pid, job.core)
    return proc


def run_pool(
    jobs: list[Job],
    *,
    slots: int,
    cores: list[int] | None,
    on_start: Callable[[Job], None],
    on_end: Callable[[Job], None],
    command: list[str] | None = None,
    keep_starting: Callable[[], bool] = lambda: True,
    poll_sec: float = 0.1,
) -> int | None:
    """Run ``jobs``, ``slots`` at once, slot ``i`` pinned to ``cores[i % len(cores)]``
    (``cores=None``: unpinned), each ``command + job.argv`` (default :func:`train_command`).
    A job starts only while ``keep_starting()`` (e.g. a time budget); the ones left never run
    (their ``returncode`` stays None). Returns the signal number that stopped the pool, or None."""
    command = command or train_command()
    pending = list(reversed(jobs))
    running: dict[int, tuple[subprocess.Popen, Job]] = {}  # slot -> child
    with _Forwarder(running) as forwarder:

        def starting() -> bool:
            return bool(pending) and not forwarder.requested and keep_starting()

        while running or starting():
            free = [s for s in range(slots) if s not in running]
            while free and starting():
                slot, job = free.pop(0), pending.pop()
                job.core = cores[slot % len(cores)] if cores else None
                job.wall_sec = time.perf_counter()
                running[slot] = (_start(job, command), job)
                on_start(job)
            forwarder.forward()
            time.sleep(poll_sec)
            for slot, (proc, job) in list(running.items()):
                if proc.poll() is not None:
                    del running[slot]
                    job.returncode = proc.returncode
                    job.wall_sec = time.perf_counter() - job.wall_sec
                    on_end(job)
    return forwarder.requested
