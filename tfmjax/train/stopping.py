"""Stopping on a signal: SIGTERM and Ctrl-C set a flag the loop checks at safe points.

:class:`StopSignals` holds the flag (a second Ctrl-C interrupts at once);
:class:`Interrupted` is raised for a signal that came before the first step (nothing
saved); :class:`StopAgreement` makes every process stop after the same step.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable

import jax

from tfmjax.parallel.processes import any_process


class Interrupted(Exception):
    """SIGINT/SIGTERM came before the first step of this process finished: nothing saved.

    ``exit_code``: 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signame: str, start: int = 0):
        kept = f" (checkpoint step {start} is kept)" if start else ""
        super().__init__(f"{signame}: interrupted before the first step: nothing saved{kept}")
        self.signame = signame
        self.exit_code = 128 + signal.Signals[signame].value


_EXITING = threading.Lock()


def _exit_now(stop: StopSignals) -> None:
    """A second Ctrl-C: one line and exit 130 at once, from the handler or a thread.

    No cleanup runs but ``stop.on_exit_now`` (set by the training loop: it removes what a
    run that saved nothing created, and says what the workdir holds): a checkpoint being
    written stays an orbax tmp dir, which the next run removes (saves are atomic, so the
    newest finished step is intact).
    """
    if not _EXITING.acquire(blocking=False):
        return  # the handler and the watcher both saw it: the other one exits
    try:
        kept = "nothing new was saved"  # before the loop has a workdir: true of any
        if stop.on_exit_now is not None:
            try:
                kept = stop.on_exit_now()
            except Exception:  # noqa: BLE001  (exiting all the same)
                kept = "the last saved checkpoint, if any, is intact"
        os.write(2, f"second Ctrl-C: exiting now; {kept}\n".encode())
    finally:
        os._exit(130)


class StopSignals:
    """SIGTERM and the first Ctrl-C set a flag (``requested``) that is checked at safe
    points: before the first step (:class:`Interrupted`) and after every step (save, stop).

    The handler only sets the flag, so it never raises inside XLA (compiling) or Orbax
    (saving). A second Ctrl-C raises KeyboardInterrupt (a library call, e.g. in a notebook)
    or, with ``exit_on_second`` (``train.py``), exits 130 at once: in the handler, or, while
    the main thread is inside a long C++ call (an XLA compile) where Python handlers wait,
    from a thread that reads the signal wakeup fd, armed by the first signal. Nested
    (``train.py`` enters one before building the run, ``train`` its own), the inner one
    shares the outer one's flag.
    """

    _active: StopSignals | None = None

    def __init__(self, *, exit_on_second: bool = False):
        self.requested: str | None = None
        self.exit_on_second = exit_on_second
        self._previous = {}
        self._outer: StopSignals | None = None
        self._wakeup: tuple[int, int] | None = None  # (write fd, previous wakeup fd)
        # set by the training loop: tidies and says what is saved (a second Ctrl-C's line)
        self.on_exit_now: Callable[[], str] | None = None

    @classmethod
    def active(cls) -> StopSignals | None:
        """The outermost StopSignals entered in this process (``train.py``'s), or None."""
        return cls._active

    def __enter__(self):
        if StopSignals._active is not None:
            self._outer = StopSignals._active
            return self._outer
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
            StopSignals._active = self
        return self

    def take(self, signame: str | None) -> None:
        """Adopt a signal caught before this was installed (by ``train.py``'s first handler)."""
        if signame and not self.requested:
            self.requested = signame
            self._arm()

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:  # a second Ctrl-C
            if not self.exit_on_second:
                raise KeyboardInterrupt
            _exit_now(self)
        if not self.requested:
            self.requested = signal.Signals(signum).name
            self._arm()

    def _arm(self) -> None:
        """From now on any Ctrl-C exits at once, even while a C++ call holds the main thread."""
        if not self.exit_on_second or self._wakeup is not None or not self._previous:
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            os.close(read)
            os.close(write)
            return
        self._wakeup = (write, previous)
        threading.Thread(
            target=_watch, args=(read, self), name="second-ctrl-c", daemon=True
        ).start()

    def __exit__(self, *exc):
        if self._outer is not None:
            self._outer = None
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if StopSignals._active is self:
            StopSignals._active = None
        if self._wakeup is not None:
            write, previous = self._wakeup
            signal.set_wakeup_fd(previous)
            os.close(write)  # the watcher reads EOF and ends
            self._wakeup = None


def _watch(read: int, stop: StopSignals) -> None:
    """The armed watcher: the C-level handler writes each signal's number to the wakeup fd."""
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while data := pipe.read(64):
            if signal.SIGINT.value in data:
                _exit_now(stop)


class StopAgreement:
    """Every process stops after the same step: ``check(step)`` at each step's end returns
    the signal any process got, or None.

    One process: its own flag, every step. Several: the processes agree by one all-gather
    of (signal, the interval each proposes) at agreed steps only, every ``interval`` steps;
    each proposes the interval that keeps the gather under ``budget`` of the time spent
    between two gathers (the gather's last cost against the step time measured since),
    at most ``max_interval``. A signal is acted on at the next agreed step: all processes
    stop after that same step. Gathering after every step cost 3.4 ms against a 134 ms
    step of ``configs/reverse.toml`` on 2 loaded processes (bench/stop_agreement.py).
    """

    def __init__(
        self,
        stop: StopSignals,
        budget: float = 0.01,
        max_interval: int = 50,
        processes: int | None = None,
        clock=time.perf_counter,
    ):
        self.stop, self.budget, self.max_interval = stop, budget, max_interval
        self.processes = jax.process_count() if processes is None else processes
        self.clock = clock
        self.next_step: int | None = None  # the next agreed step (None: the first call)
        self._cost = 0.0  # seconds of the last gather
        self._since, self._last_step = clock(), 0

    def check(self, step: int) -> str | None:
        if self.processes == 1:
            return self.stop.requested
        if self.next_step is not None and step < self.next_step:
            return None
        begin = self.clock()
        per_step = (begin - self._since) / max(step - self._last_step, 1)
        wanted = self._cost / (self.budget * per_step) if per_step > 0 else 1.0
        proposal = min(max(math.ceil(wanted), 1), self.max_interval)
        requested = signal.Signals[self.stop.requested].value if self.stop.requested else 0
        number, interval = any_process(requested, proposal)
        self._since = self.clock()
        self._cost, self._last_step = self._since - begin, step
        self.next_step = step + interval
        return signal.Signals(number).name if number else None
