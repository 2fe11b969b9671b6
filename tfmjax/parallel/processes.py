"""Many processes: join JAX's distributed runtime, say which process speaks, agree on
stopping, copy split arrays to the host, and end when a peer is lost.

Every process runs the same command; only its id differs::

    python train.py CONFIG --coordinator HOST:PORT --num-processes N --process-id I

The three values also come from ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID``; ``--distributed`` alone lets JAX read them from the cluster (a TPU pod
slice, SLURM, Open MPI). JAX's runtime connects the processes and runs the collectives
(gloo on CPU, NCCL on GPU, ICI on TPU); nothing here sends data between processes.

A lost peer: each process publishes a heartbeat in the runtime's key-value store every
second and reads the others' (:class:`PeerWatch`). When a peer's has not moved for
``--peer-timeout`` seconds, or the coordinator stops answering for as long, the process
prints one line and exits :data:`LOST_PEER_EXIT`, even from inside a collective that will
never finish. JAX's own heartbeat check is set to twice that, as the backstop. An error
that follows a peer's loss (a save or a collective broken by it, as gloo's "connection
closed by peer") ends the same way: :func:`fail` settles first whether a peer is gone.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from tfmjax.config import ConfigError

ENV = {
    "coordinator": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}
LOST_PEER_EXIT = 3
DEFAULT_PEER_TIMEOUT = 60.0
_PREFIX = "tfmjax/"
_joined: list = []  # the PeerWatch of this process's run, while it is joined (at most one)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that join a run of many processes (``train.py`` and ``eval.py``)."""
    group = parser.add_argument_group("many processes (one command per process)")
    group.add_argument(
        "--coordinator", metavar="HOST:PORT", help=f"process 0's address (env {ENV['coordinator']})"
    )
    group.add_argument(
        "--num-processes", type=int, metavar="N", help=f"how many (env {ENV['num_processes']})"
    )
    group.add_argument(
        "--process-id", type=int, metavar="I", help=f"this one, 0..N-1 (env {ENV['process_id']})"
    )
    group.add_argument(
        "--distributed",
        action="store_true",
        help="join even without the three above: JAX reads them from a TPU pod, SLURM or MPI",
    )
    group.add_argument(
        "--peer-timeout",
        type=float,
        default=DEFAULT_PEER_TIMEOUT,
        metavar="SECONDS",
        help=f"a peer silent this long ends the run, exit {LOST_PEER_EXIT} "
        f"(default {DEFAULT_PEER_TIMEOUT:g})",
    )


def _setting(args, name: str):
    value = getattr(args, name, None)
    if value is None and os.environ.get(ENV[name]):
        raw = os.environ[ENV[name]]
        if name == "coordinator":
            return raw
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{ENV[name]}={raw!r} is not an integer") from None
    return value


def join(args) -> PeerWatch | None:
    """Join the run's processes when any of the flags (or variables) is given; call before
    JAX touches a device. Returns the started :class:`PeerWatch` (None: one process).
    ConfigError (one line) for values that cannot work."""
    coordinator, count, index = (_setting(args, name) for name in ENV)
    if coordinator is None and count is None and index is None and not args.distributed:
        return None
    if count is not None and count < 1:
        raise ConfigError(f"--num-processes={count} must be >= 1")
    if index is not None and count is not None and not 0 <= index < count:
        raise ConfigError(f"--process-id={index} must be in 0..{count - 1} (--num-processes)")
    if args.peer_timeout <= 0:
        raise ConfigError(f"--peer-timeout={args.peer_timeout:g} must be > 0 seconds")
    try:
        jax.distributed.initialize(
            coordinator,
            count,
            index,
            heartbeat_timeout_seconds=int(2 * args.peer_timeout) + 1,
        )
    except (ValueError, TypeError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"could not join the processes: {first}; give --coordinator HOST:PORT, "
            "--num-processes and --process-id (or run on a cluster JAX detects)"
        ) from None
    if jax.process_count() == 1:
        return None
    watch = PeerWatch(jax.process_index(), jax.process_count(), args.peer_timeout)
    watch.start()
    _joined[:] = [watch]
    return watch


def is_main() -> bool:
    """Whether this process prints, logs and plots (process 0; the only one, usually)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all have come (nothing to wait for with one)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def tag() -> str:
    """``"process 1 of 2: "`` in a run of many processes, else empty: prefixes error lines."""
    if jax.process_count() == 1:
        return ""
    return f"process {jax.process_index()} of {jax.process_count()}: "


def any_process(*values: int) -> int | tuple[int, ...]:
    """The largest of each of ``values`` over all processes, in one gather (each process
    must call it at the same point): an int for one value, else a tuple."""
    if jax.process_count() == 1:
        out = tuple(int(v) for v in values)
    else:
        gathered = multihost_utils.process_allgather(np.asarray(values, np.int32))
        out = tuple(int(v) for v in np.max(gathered.reshape(-1, len(values)), axis=0))
    return out[0] if len(out) == 1 else out


def to_host(tree):
    """``jax.device_get`` that also works for arrays split over several processes: those are
    gathered (a collective: every process must call this at the same point)."""
    leaves, treedef = jax.tree.flatten(tree)
    split = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
    ]
    if split:
        parts = [leaves[i] for i in split]
        replicated = all(leaf.is_fully_replicated for leaf in parts)
        gathered = (
            [leaf.addressable_data(0) for leaf in parts]
            if replicated
            else multihost_utils.process_allgather(parts, tiled=True)
        )
        for i, host in zip(split, gathered, strict=True):
            leaves[i] = np.asarray(host)
    return jax.device_get(jax.tree.unflatten(treedef, leaves))


class PeerWatch:
    """Heartbeats through the runtime's key-value store, on a daemon thread.

    Every ``interval`` seconds this process bumps its own beat and reads everyone's. A peer
    whose beat has not changed for ``timeout`` seconds (and which has not said it finished,
    :meth:`finish`), or a store that has not answered for as long (process 0, which hosts
    it, is gone), ends this process with one line on stderr and exit :data:`LOST_PEER_EXIT`.
    """

    def __init__(self, me: int, count: int, timeout: float, interval: float = 1.0, client=None):
        self.me, self.count, self.timeout, self.interval = me, count, timeout, interval
        # the runtime's key-value store (no public handle); a stand-in in tests
        self.client = client or jax._src.distributed.global_state.client  # noqa: SLF001
        self._stop = threading.Event()
        # peer -> (its last beat seen, when it last changed); written by the watch thread
        start = time.monotonic()
        self._last = {p: (None, start) for p in range(count) if p != me}
        self._done: set[int] = set()  # peers that ended cleanly
        self.failed_together: bool | None = None  # set once, by settle_failure

    def start(self) -> None:
        threading.Thread(target=self._run, name="peer-watch", daemon=True).start()

    def finish(self) -> None:
        """This process ended cleanly: the others stop watching it."""
        self._stop.set()
        try:
            self.client.key_value_set(f"{_PREFIX}done/{self.me}", "1", allow_overwrite=True)
        except Exception:  # noqa: BLE001  (the others are gone too: nothing to tell)
            pass

    def _read(self) -> dict[str, str]:
        beat = f"{_PREFIX}beat/{self.me}"
        self.client.key_value_set(beat, str(self._beat), allow_overwrite=True)
        return dict(self.client.key_value_dir_get(_PREFIX))

    def _run(self) -> None:
        self._beat = 0
        last = self._last
        answered = time.monotonic()
        while not self._stop.wait(self.interval):
            self._beat += 1
            now = time.monotonic()
            try:
                store = self._read()
            except Exception:  # noqa: BLE001  (process 0's store is unreachable)
                if now - answered > self.timeout:
                    self._lost(0, "its coordinator (process 0)")
                continue
            answered = now
            for peer, (beat, since) in last.items():
                if store.get(f"{_PREFIX}done/{peer}"):
                    self._done.add(peer)
                    continue
                value = store.get(f"{_PREFIX}beat/{peer}")
                if value != beat:
                    last[peer] = (value, now)
                elif now - since > self.timeout:
                    self._lost(peer, f"process {peer}")

    def silent_peers(self, longer_than: float) -> list[int]:
        """The peers whose beat has not moved for ``longer_than`` seconds, those that said
        they finished (:meth:`finish`) aside."""
        now = time.monotonic()
        return [
            p
            for p, (_, since) in list(self._last.items())
            if p not in self._done and now - since > longer_than
        ]

    def settle_failure(self, wait: float = 5.0) -> None:
        """This process is about to end on an error: decide what the error means, once.

        The processes that all hit it (a bad config fails everywhere) meet at a barrier
        within ``wait`` seconds: ``failed_together``, the error is theirs. Otherwise, when a
        peer has been silent through that wait, the error likely follows its loss (a save
        whose gloo gather lost its peer): wait for this watch's verdict, which exits
        :data:`LOST_PEER_EXIT` with the lost-peer line, up to the timeout. A peer that
        beats again, or peers that never stopped, mean the error is this process's alone.
        """
        if self.failed_together is not None:
            return
        try:
            self.client.wait_at_barrier(f"{_PREFIX}failed", int(wait * 1000))
            self.failed_together = True
            return
        except Exception:  # noqa: BLE001  (a peer did not come: still running, or gone)
            self.failed_together = False
        deadline = time.monotonic() + self.timeout + 3 * self.interval
        while self.silent_peers(longer_than=2 * self.interval) and time.monotonic() < deadline:
            time.sleep(self.interval / 4)  # the watch thread exits the process if it is lost

    def _lost(self, peer: int, who: str) -> None:
        if self._stop.is_set():
            return
        line = (
            f"process {self.me} of {self.count}: lost {who}: no heartbeat for "
            f"{self.timeout:g} s, so the run cannot go on; exiting {LOST_PEER_EXIT}. Rerun the "
            "same command on every process: it resumes from the last checkpoint\n"
        )
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os.write(2, line.encode())
        os._exit(LOST_PEER_EXIT)


def run_joined(args, body) -> int:
    """``body()``'s exit code, run as one of the processes the flags name (or alone): join,
    run, leave (:func:`end`). A join that cannot work prints one line and returns 2."""
    try:
        watch = join(args)  # before JAX touches a device
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        code = body()
    except Exception:
        if watch is not None:
            watch.settle_failure()  # a lost peer's line wins over this traceback
        raise
    end(watch, code)
    return code


def fail(line: str, code: int) -> int:
    """Print ``line``, the error that ends this process, and return ``code``. With several
    processes, :meth:`PeerWatch.settle_failure` runs first, so an error that follows a
    peer's loss ends as that loss (exit :data:`LOST_PEER_EXIT`), while an error every
    process hits is printed at once."""
    if _joined:
        _joined[0].settle_failure()
    print(line, file=sys.stderr)
    return code


def end(watch: PeerWatch | None, code: int, wait: float = 5.0) -> None:
    """Leave the run. A clean end (``code`` 0) tells the peers and lets JAX shut down with
    them. On an error, the processes that all hit it (a bad config fails everywhere) meet
    and shut down together within ``wait`` seconds; a process that failed alone exits at
    once instead (its peers, stuck in a collective with it, see it lost)."""
    if watch is None:
        return
    if code == 0:
        watch.finish()
        return
    watch.settle_failure(wait)  # at once when fail() has settled it already
    if watch.failed_together:
        watch.finish()
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
