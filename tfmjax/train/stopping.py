"""Stopping on a signal: SIGTERM and Ctrl-C set a flag the loop checks at safe points.

:class:`StopSignals` holds the flag (a second Ctrl-C interrupts at once);
:class:`Interrupted` is raised for a signal that came before the first step (nothing
saved); :func:`agreed_stop` makes every process stop after the same step.
"""

from __future__ import annotations

import os
import signal
import threading

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


def _exit_now() -> None:
    """A second Ctrl-C: one line and exit 130 at once, from the handler or a thread.

    No cleanup runs: a checkpoint being written stays an orbax tmp dir, which the next
    run removes (saves are atomic, so the newest finished step is intact).
    """
    if not _EXITING.acquire(blocking=False):
        return  # the handler and the watcher both saw it: the other one exits
    try:
        os.write(2, b"second Ctrl-C: exiting now; the last saved checkpoint is intact\n")
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
            _exit_now()
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
        threading.Thread(target=_watch, args=(read,), name="second-ctrl-c", daemon=True).start()

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


def _watch(read: int) -> None:
    """The armed watcher: the C-level handler writes each signal's number to the wakeup fd."""
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while data := pipe.read(64):
            if signal.SIGINT.value in data:
                _exit_now()


def agreed_stop(stop: StopSignals) -> str | None:
    """The signal any process got (all processes stop after the same step), or None."""
    if jax.process_count() == 1:
        return stop.requested
    number = any_process(signal.Signals[stop.requested].value if stop.requested else 0)
    return signal.Signals(number).name if number else None
