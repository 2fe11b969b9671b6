"""The one-program executor: the seeds of each grid point trained as one vmapped program
(:func:`tfmjax.train.stacked.train_stacked`), in this process, one grid point after another.

Grid values may change anything (shapes included): each point is its own program; only its
seeds share one. Each run's console goes to its ``train.log``; each run is told how its group
ended as the process pool tells it of a child (exit 0, 1 for a non-finite loss, 2 for a bad
config or checkpoint), with the group's wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from tfmjax.sweep.grid import RunSpec
from tfmjax.sweep.processes import LOG_FILE, Job


def by_point(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """The runs grouped by grid point, in order."""
    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.point_name, []).append(spec)
    return list(groups.values())


def _train_group(group: list[RunSpec]) -> tuple[int, str | None]:
    """``(exit code, signal name or None)`` of one group, trained; its error on its logs."""
    from tfmjax.checkpoint import CheckpointError
    from tfmjax.config.errors import ConfigError
    from tfmjax.train.loop import NonFiniteLossError
    from tfmjax.train.stacked import train_stacked

    with contextlib.ExitStack() as stack:
        logs = []
        for spec in group:
            spec.workdir.mkdir(parents=True, exist_ok=True)
            logs.append(stack.enter_context(open(spec.workdir / LOG_FILE, "a")))
        try:
            result = train_stacked([spec.experiment for spec in group], streams=logs)
        except (ConfigError, CheckpointError, NonFiniteLossError) as err:
            for log in logs:
                print(f"error: {err}", file=log)
            return (1 if isinstance(err, NonFiniteLossError) else 2), None
    return 0, result["stopped"] or None


def run_groups(
    specs: list[RunSpec],
    on_start: Callable[[Job], None],
    on_end: Callable[[Job], None],
) -> str | None:
    """Train every grid point's runs as one program; the signal that stopped them, or None."""
    from tfmjax.train.stopping import StopSignals

    with StopSignals() as stop:  # shared by each group's own: a signal stops the sweep
        for group in by_point(specs):
            if stop.requested:
                break
            jobs = [Job(spec.name, [], spec.workdir) for spec in group]
            for job in jobs:
                on_start(job)
            begin = time.perf_counter()
            code, _ = _train_group(group)
            for job in jobs:
                job.wall_sec, job.returncode = time.perf_counter() - begin, code
                on_end(job)
        return stop.requested
