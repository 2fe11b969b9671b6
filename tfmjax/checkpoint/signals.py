"""Signals held back around Orbax calls, and Orbax's absl chatter kept quiet."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGTERM/SIGINT back inside the block and re-deliver them when it ends.

    A Python signal handler runs in the main thread between two bytecodes, possibly in the
    middle of orbax code that holds a lock; a handler that saves would then deadlock or
    interleave two saves. Deferring makes save()/wait() atomic with respect to handlers.
    A no-op outside the main thread (handlers never run there).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if handler is None:  # installed outside Python: leave it alone
            continue
        previous[sig] = handler
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):  # each pending signal once, in arrival order
            signal.raise_signal(sig)


@contextlib.contextmanager
def quiet_absl():
    """Silence orbax's absl warnings (read-only manager chatter) inside the block."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
