"""``python -m tfmjax.sweep CONFIG --seeds 0,1,2 --grid optim.learning_rate=1e-3,3e-3 ...``

Trains every (grid point, seed) run of the config, each in its own workdir under the sweep's
directory (``--workdir``, default ``runs/sweep-<config name>``), then writes ``sweep.jsonl``,
prints a table over seeds and draws ``metric.png`` and ``curves.png`` there. Rerunning the
command trains only what is missing (an interrupted run resumes as ``train.py`` does).
Ctrl-C / SIGTERM: every run in flight saves and stops; exit 130 / 143. Exit 2: a bad
config, grid or option (one line); exit 1: a run failed or diverged (its ``train.log`` says
why).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from tfmjax.config.choices import EVAL_METRICS
from tfmjax.config.errors import ConfigError
from tfmjax.config.loading import load
from tfmjax.sweep.grid import expand, parse_axes, parse_seeds
from tfmjax.sweep.plots import CURVES_PLOT, METRIC_PLOT, plot_curves, plot_metric
from tfmjax.sweep.processes import LOG_FILE, Job, default_cores, run_pool
from tfmjax.sweep.results import (
    RESULTS_FILE,
    add_wall_time,
    is_finished,
    run_record,
    table,
    write_results,
)

EXECUTORS = ("auto", "processes", "vmap")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tfmjax.sweep", description=__doc__.splitlines()[0])
    p.add_argument("config", help="experiment TOML, e.g. configs/reverse.toml")
    p.add_argument("overrides", nargs="*", help="section.key=value for every run")
    p.add_argument("--seeds", default="0", help="train.seed values: 0,1,2 or 0-4 (default 0)")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        help="section.key=v1,v2,... (repeatable: the grid is every combination)",
    )
    p.add_argument("--workdir", help="the sweep's directory (default runs/sweep-<config name>)")
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="auto",
        help="processes: a pool of train.py; vmap: the runs that share every shape (seeds, "
        "learning rates, dropout rates, ...) as one program; "
        "auto: vmap on an accelerator, else processes",
    )
    p.add_argument("--jobs", type=int, help="runs at once (default: one per core)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each run to a core")
    p.add_argument("--metric", help="eval metric of the table and plots (train.best_metric)")
    return p


def _options(args, base) -> tuple[str, int, list[int]]:
    """The metric, the number of slots and the cores: ConfigError for a bad one."""
    metric = args.metric or base.train.best_metric
    if metric not in EVAL_METRICS:
        raise ConfigError(f"--metric {metric!r} is not an eval metric; use one of {EVAL_METRICS}")
    cores = default_cores()
    jobs = args.jobs if args.jobs is not None else len(cores)
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be >= 1")
    return metric, jobs, cores


def _executor(name: str) -> str:
    """``auto``: the one-program executor on an accelerator, the process pool on a CPU."""
    if name != "auto":
        return name
    import jax

    return "processes" if jax.default_backend() == "cpu" else "vmap"


def _announce(job: Job) -> None:
    core = f" on core {job.core}" if job.core is not None else ""
    print(f"start {job.name}{core}", flush=True)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _finished(runs_by_name: dict, failed: list[str]):
    def on_end(job: Job) -> None:
        add_wall_time(job.workdir, job.wall_sec, job.returncode)
        took = f"{job.name} in {job.wall_sec:.1f}s"
        if is_finished(runs_by_name[job.name]):
            print(f"done   {took}", flush=True)
        elif job.returncode in (0, 130, 143):  # a signal: saved, or stopped before a step
            print(f"stopped {took}", flush=True)
        else:
            failed.append(job.name)
            log = job.workdir / LOG_FILE
            print(f"failed {took}: exit {job.returncode}: {_last_line(log)} ({log})", flush=True)

    return on_end


def report(sweep_dir: Path, runs, axes, base, metric: str) -> list[dict]:
    """Write ``sweep.jsonl``, print the table, draw the figures; the records."""
    records = [run_record(spec, base, metric) for spec in runs]
    write_results(sweep_dir / RESULTS_FILE, records)
    print(table(records, metric))
    written = [
        plot_metric(sweep_dir / METRIC_PLOT, axes, records, metric),
        plot_curves(sweep_dir / CURVES_PLOT, records, metric),
    ]
    shown = ", ".join(str(p) for p in [sweep_dir / RESULTS_FILE, *written] if p)
    print(f"wrote {shown}")
    return records


def main(argv=None) -> int:
    try:
        return _main(parser().parse_intermixed_args(argv))
    except KeyboardInterrupt:  # before the pool took the signals over, or in the report
        print("interrupted: runs already saved stay; rerun the same command", file=sys.stderr)
        return 130


def _main(args) -> int:
    try:
        base = load(args.config, args.overrides)
        sweep_dir = Path(args.workdir or f"runs/sweep-{base.name}")
        axes = parse_axes(args.grid, args.overrides)
        seeds = parse_seeds(args.seeds)
        metric, slots, cores = _options(args, base)
        runs = expand(args.config, args.overrides, axes, seeds, sweep_dir)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sweep_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"config": str(args.config), "overrides": args.overrides, "grid": args.grid}
    (sweep_dir / "sweep.json").write_text(json.dumps({**manifest, "seeds": seeds}) + "\n")
    todo = [spec for spec in runs if not is_finished(spec)]
    executor = _executor(args.executor) if todo else "processes"
    slots = min(slots, max(len(todo), 1))
    plan = f"{len(todo)} to train, {slots} at once" if todo else "nothing to train"
    pinned = ", each on one core" if todo and not args.no_pin else ""
    if executor == "vmap":
        from tfmjax.sweep.stacked import by_shape

        programs = len(by_shape(todo))
        plan, pinned = f"{len(todo)} to train as {programs} program(s), one per shape", ""
    print(
        f"sweep of {len(runs)} runs in {sweep_dir}: {len(runs) - len(todo)} done, {plan}{pinned}",
        flush=True,
    )
    failed: list[str] = []
    on_end = _finished({spec.name: spec for spec in runs}, failed)
    if executor == "vmap":
        from tfmjax.sweep.stacked import run_groups

        name = run_groups(todo, _announce, on_end)
        stopped = signal.Signals[name] if name else None
    else:
        argv = lambda spec: [str(args.config), *spec.overrides]
        jobs = [Job(spec.name, argv(spec), spec.workdir) for spec in todo]
        cores = None if args.no_pin else cores
        stopped = run_pool(jobs, slots=slots, cores=cores, on_start=_announce, on_end=on_end)
    report(sweep_dir, runs, axes, base, metric)
    if stopped:
        name = signal.Signals(stopped).name
        print(f"{name}: the runs in flight saved and stopped; rerun the same command to finish")
        return 128 + stopped
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
