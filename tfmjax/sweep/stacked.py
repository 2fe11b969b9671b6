"""The one-program executor: the runs that share every shape trained as one vmapped program
(:func:`tfmjax.train.stacked.train_stacked`), in this process, one group after another.

Runs are grouped by everything but ``train.seed`` and the numbers a program takes per run
(:data:`tfmjax.train.run.HYPERPARAMETERS`: learning rate, weight decay, warmup, dropout
rate, label smoothing): a grid over those is one program, a grid value that changes a shape
or the code (width, layers, position encoding, schedule) starts another group. Each run's
console goes to its ``train.log``, which first names the runs of its program; each run is
told how its group ended as the process pool tells it of a child (exit 0, 1 for a
non-finite loss, 2 for a bad config or checkpoint), with the group's wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from tfmjax.sweep.grid import RunSpec
from tfmjax.sweep.processes import LOG_FILE, Job


def by_shape(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """The runs grouped into programs (one per :func:`~tfmjax.train.stacked.group_key`), in
    the order of each group's first run."""
    from tfmjax.train.stacked import group_key

    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(group_key(spec.experiment), []).append(spec)
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
        names = ", ".join(spec.name for spec in group)
        for log in logs:
            print(f"one program of {len(group)} run(s): {names}", file=log, flush=True)
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
    """Train each group of :func:`by_shape` as one program; the signal that stopped them, or
    None."""
    from tfmjax.train.stopping import StopSignals

    groups = by_shape(specs)
    with StopSignals() as stop:  # shared by each group's own: a signal stops the sweep
        for index, group in enumerate(groups):
            if stop.requested:
                break
            print(f"program {index + 1}/{len(groups)}: {len(group)} run(s)", flush=True)
            jobs = [Job(spec.name, [], spec.workdir) for spec in group]
            for job in jobs:
                on_start(job)
            begin = time.perf_counter()
            code, _ = _train_group(group)
            for job in jobs:
                job.wall_sec, job.returncode = time.perf_counter() - begin, code
                on_end(job)
        return stop.requested
