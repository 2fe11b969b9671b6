"""Building the next batches while the current steps run: one background thread, a queue of one.

:class:`Prefetcher` calls ``build(item)`` for each of ``items``, in order, on a daemon thread
and hands the results out in the same order (:meth:`Prefetcher.take`). The queue holds one
result, so the thread is at most two items ahead of the caller: one waiting in the queue,
one built and waiting to be put there. An exception raised by ``build`` is handed out in its
item's place and raised by :meth:`~Prefetcher.take` in the caller's thread, at the point where
building the item there would have raised it (same object, same one-line message); the thread
ends with it. Leaving the ``with`` block (:meth:`~Prefetcher.close`) stops the thread and
waits for it: it never outlives the run, whether the run ended, failed or was stopped.

``background=False`` builds each item in the caller's thread when it is taken: the same
results, in the same order (``train.prefetch = false``).

Signals: only the main thread runs Python's signal handlers, and the thread never waits on
anything but the queue, so SIGTERM, Ctrl-C and a lost peer (which exits the process) act as
without it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

_POLL_S = 0.5  # how often a waiting take() checks that the thread is still alive


class Prefetcher:
    def __init__(
        self,
        build: Callable[[Any], Any],
        items: Iterable,
        *,
        background: bool = True,
        name: str = "batch-prefetch",
    ):
        self._build = build
        self._items = list(items)
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background and self._items:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        for item in self._items:
            if self._stop.is_set():
                return
            try:
                result = (item, self._build(item), None)
            except BaseException as err:  # noqa: BLE001  (raised in the caller's thread)
                result = (item, None, err)
            self._queue.put(result)  # close() empties the queue: this never blocks for ever
            if result[2] is not None:
                return

    def take(self, item) -> Any:
        """The result for ``item``, the next of ``items``; raises what building it raised."""
        if self._thread is None:
            return self._build(item)
        while True:
            try:
                got, value, err = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError(f"the prefetch thread ended before item {item!r}") from None
        if got != item:
            raise RuntimeError(f"prefetch out of order: asked for {item!r}, built {got!r}")
        if err is not None:
            raise err
        return value

    def close(self) -> None:
        """Stop the thread and wait for it; what it built and nobody took is dropped."""
        self._stop.set()
        thread = self._thread
        while thread is not None and thread.is_alive():
            try:  # make room: a put blocked on the full queue returns, the thread sees the stop
                self._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)
        self._thread = None

    @property
    def running(self) -> bool:
        """Whether the background thread is alive (False without one)."""
        return self._thread is not None and self._thread.is_alive()
