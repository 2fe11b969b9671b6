"""What the experiment studies share on top of ``python -m tfmjax.sweep``'s library: each
study lists its runs (a config and overrides), trains the missing ones with the sweep's
process pool (:func:`tfmjax.sweep.processes.run_pool`: ``--jobs`` runs at once, each pinned
to one core, Ctrl-C forwarded so that every run in flight saves), stores each result as a
small JSON file keyed by a hash of the config (its non-default fields), and rewrites a table of
``docs/studies.md`` between markers.

A run is ``train.py CONFIG OVERRIDES`` in its own workdir ``runs/<study>/<name>-<hash>``
(the config hash in the name: a workdir never holds another config's run), as a sweep's run
is: its console goes to ``train.log`` there, an interrupted run resumes from its checkpoint
when the study is rerun, and a run whose last step is saved is not trained again (its result
is read from the workdir).

A result records the last eval's metrics, the eval curve, the wall time (Python start-up,
compilation, training, evals and checkpoints: ``train.py`` from start to exit, every process
that trained the run added up) and the load average around the run, since the 2-core machine
may be shared, and how many cores the run had (1: pinned, the default; ``--no-pin``: all the
study may use; these small models train about as fast on one core as on two). A run that
stops on a non-finite loss is a result (``diverged_at``), not an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tfmjax.config import SECTIONS, Experiment, load  # noqa: E402
from tfmjax.models.summary import count_params  # noqa: E402
from tfmjax.reporting.metrics_log import METRICS_FILE, read_records  # noqa: E402
from tfmjax.sweep.grid import RunSpec  # noqa: E402
from tfmjax.sweep.processes import LOG_FILE, Job, default_cores, run_pool  # noqa: E402
from tfmjax.sweep.results import DIVERGED, add_wall_time, is_finished, read_run_file  # noqa: E402

STUDIES = ROOT / "docs" / "studies.md"
RUNS = ROOT / "runs"
METRICS = ("exact_match", "token_accuracy", "loss", "bits_per_char", "accuracy")
NON_FINITE = re.compile(r"non-finite loss or gradient at step (\d+)")


def config_hash(config_path: str | Path, overrides: list[str]) -> str:
    """A hash of the experiment config: of the fields whose value differs from the field's
    default (the workdir and the mesh left out).

    The defaults are those of each section's dataclass (``ModelConfig()``, ``OptimConfig()``,
    ... in ``tfmjax.config.SECTIONS``; ``Experiment``'s for the name), compared as stored,
    never as derived: a field whose default ``None`` means "derived from others"
    (``num_kv_heads``: ``num_heads``; ``moe_renormalize``: ``top_k > 1``) is at its default
    only when it is ``None``, so giving the derived value explicitly changes the hash (a
    rerun, never a wrong match). A ``model.preset`` counts through the values it sets, each
    against ``ModelConfig()``'s, not against the preset's (its name is not in the config).

    What is hashed is the JSON, keys sorted, of ``{section: {field: value}}`` of the
    non-default values alone (``data.task_params`` whole when not empty; ``name``, the
    config file's stem, beside the sections). So a field added with a default that
    reproduces the old behaviour, as the project's rule asks, changes no hash, and no stored
    result turns stale; a value changed does. The flip side: changing an existing field's
    default changes no hash either, so the results of the configs that relied on it must be
    rerun by hand (delete them). ``tools/rehash_studies.py`` moved the results stored under
    the former hash (of every field) to this one.
    """
    return _hash(_non_default(load(ROOT / config_path, overrides).to_dict()))


def _non_default(raw: dict) -> dict:
    """The entries of ``raw`` (an :meth:`Experiment.to_dict`) whose value differs from the
    default of their field (each section's dataclass, ``Experiment``'s for the name), without
    the workdir and the mesh."""
    out: dict = {}
    if not _same(raw["name"], {"name": Experiment.name}, "name"):
        out["name"] = raw["name"]
    for section, cls in SECTIONS.items():
        if section == "mesh":
            continue
        values = {**raw[section], "workdir": ""} if section == "train" else raw[section]
        default = dataclasses.asdict(cls())
        changed = {k: v for k, v in values.items() if not _same(v, default, k)}
        if changed:
            out[section] = changed
    return out


def _same(value, defaults: dict, key: str) -> bool:
    """Whether ``value`` is ``defaults[key]``, as JSON (``1`` and ``1.0`` differ, as do
    ``True`` and ``1``; a key with no default is never the same)."""
    return key in defaults and json.dumps(value, sort_keys=True) == json.dumps(
        defaults[key], sort_keys=True
    )


def _hash(raw: dict) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


def is_current(path: Path, config_path: str | Path, overrides: list[str]) -> bool:
    """Whether ``path`` holds a result of exactly this config."""
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("config_hash") == config_hash(config_path, overrides)


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a study: ``train.py CONFIG OVERRIDES``, named ``name`` in ``runs/<study>/``
    and announced as ``training <label> ...``."""

    study: str
    name: str
    label: str
    config: str  # relative to the repository root
    overrides: tuple[str, ...]
    root: Path = RUNS  # see runs_dir

    @property
    def workdir(self) -> Path:
        digest = config_hash(self.config, list(self.overrides))
        return self.root / self.study / f"{self.name}-{digest}"

    def spec(self) -> RunSpec:
        """The run as the sweep's library sees it (its finished-run test reads ``train.steps``)."""
        workdir = self.workdir
        args = (*self.overrides, f"train.workdir={workdir}")
        experiment = load(ROOT / self.config, list(args))
        return RunSpec((), self.name, experiment.train.seed, workdir, args, experiment)


def runs_dir(results: str | None) -> Path:
    """Where runs train: ``runs/``, or ``RESULTS/runs`` when ``--results`` is given (tests:
    a test's runs never meet a finished workdir left by another session)."""
    return Path(results) / "runs" if results else RUNS


def result(run: Run, wall: dict | None = None, cores: int | None = None) -> dict:
    """The result record of ``run`` from its workdir (``metrics.jsonl``, ``train.log``, the
    sweep's ``sweep_run.json``); ``wall``: the load averages seen around its last process."""
    workdir = run.workdir
    log = workdir / LOG_FILE
    diverged = NON_FINITE.findall(log.read_text(errors="replace")) if log.is_file() else []
    evals = [r for r in read_records(workdir / METRICS_FILE) if r.get("split") == "eval"]
    last = evals[-1] if evals else {"step": 0}
    overrides = list(run.overrides)
    return {
        "config": run.config,
        "overrides": overrides,
        "config_hash": config_hash(run.config, overrides),
        "params": count_params(load(ROOT / run.config, overrides).model),
        "diverged_at": int(diverged[-1]) if diverged and not is_finished(run.spec()) else None,
        "step": last["step"],
        **{k: last[k] for k in METRICS if k in last},
        "curve": [{k: r[k] for k in ("step", *METRICS) if k in r} for r in evals],
        "wall_sec": round(read_run_file(workdir)["wall_sec"], 1),
        "load_before": (wall or {}).get("load_before"),
        "load_after": (wall or {}).get("load_after"),
        "cores": cores,
        "date": time.strftime("%Y-%m-%d"),
    }


def _tail(path: Path, lines: int = 5) -> str:
    text = path.read_text(errors="replace").splitlines() if path.is_file() else ["no output"]
    return "\n".join(text[-lines:])


def train_missing(
    runs: list[Run],
    on_result: Callable[[Run, dict], None],
    *,
    jobs: int | None = None,
    pin: bool = True,
    budget: float | None = None,
    dry_run: bool = False,
) -> int:
    """Train ``runs`` (those of a study with no current result) through the sweep's pool and
    hand each finished or diverged one's :func:`result` to ``on_result`` as it ends; a run
    already finished in its workdir is not trained again. ``budget``: seconds after which no
    run starts. The exit code: 0, 1 (a run failed; its ``train.log`` is shown) or 128 +
    the signal that stopped the pool (the runs in flight saved)."""
    if dry_run:
        print(f"{len(runs)} run(s) to train" + "".join(f"\n  {r.label}" for r in runs))
        return 0
    todo = []
    for run in runs:
        if is_finished(run.spec()):
            on_result(run, result(run))
        else:
            todo.append(run)
    cores = default_cores()
    slots = max(1, min(jobs or len(cores), len(todo)))
    by_name = {run.spec().name: run for run in todo}
    loads: dict[str, dict] = {}
    failed: list[str] = []

    def on_start(job: Job) -> None:
        loads[job.name] = {"load_before": round(os.getloadavg()[0], 2)}
        print(f"training {by_name[job.name].label} ...", flush=True)

    def on_end(job: Job) -> None:
        run = by_name[job.name]
        add_wall_time(job.workdir, job.wall_sec, job.returncode)
        loads[job.name]["load_after"] = round(os.getloadavg()[0], 2)
        log = (job.workdir / LOG_FILE).read_text(errors="replace")
        if is_finished(run.spec()) or (job.returncode == DIVERGED and NON_FINITE.search(log)):
            record = result(run, loads[job.name], 1 if job.core is not None else len(cores))
            try:  # the pool goes on: runs in flight are not left without their parent
                on_result(run, record)
            except Exception:
                failed.append(run.label)
                print(f"{run.label}: storing its result failed:\n{traceback.format_exc()}")
        elif job.returncode not in (0, 130, 143):  # 0, 130, 143: a signal stopped it
            failed.append(run.label)
            print(f"{run.label} failed: exit {job.returncode}:\n{_tail(job.workdir / LOG_FILE)}")

    start = time.monotonic()

    def within() -> bool:
        return budget is None or time.monotonic() - start < budget  # 0: start none

    pool = []
    for name, run in by_name.items():
        spec = run.spec()
        pool.append(Job(name, [str(ROOT / run.config), *spec.overrides], spec.workdir))
    stopped = run_pool(
        pool,
        slots=slots,
        cores=cores if pin else None,
        on_start=on_start,
        on_end=on_end,
        keep_starting=within,
    )
    if stopped:
        print(f"{signal.Signals(stopped).name}: the runs in flight saved; rerun to finish them")
        return 128 + stopped
    if any(job.returncode is None for job in pool):
        print("time budget spent: the rest stays pending", flush=True)
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def spread(values, fmt: str = "{:.3f}") -> str:
    """``mean (min-max)`` of ``values`` for a study's table, or the one value ("" for none)."""
    if not values:
        return ""
    mean = fmt.format(sum(values) / len(values))
    if len(values) == 1:
        return mean
    return f"{mean} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def save(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def write_table(begin: str, end: str, text: str, page: Path = STUDIES) -> None:
    """Replace what lies between the markers ``begin`` and ``end`` in ``page``."""
    content = page.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(content):
        raise SystemExit(f"{page.name} has no {begin} ... {end} block to rewrite")
    page.write_text(pattern.sub(lambda _: f"{begin}\n{text}\n{end}", content))


def parser(doc: str, names) -> argparse.ArgumentParser:
    """The options every study takes: ``--only NAME`` (repeatable), ``--table``, ``--jobs``,
    ``--no-pin``, ``--dry-run``, ``--budget`` (0: train nothing, only tabulate), and for
    tests ``--extra`` (an override for every run) and ``--results`` (where results go)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--only", choices=list(names), action="append", help="one of (repeatable)")
    p.add_argument(
        "--table", action="store_true", help="rewrite the study's table in docs/studies.md"
    )
    p.add_argument("--jobs", type=_positive, help="runs at once (default: one per core)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each run to a core")
    p.add_argument("--dry-run", action="store_true", help="list the runs to train, train none")
    p.add_argument(
        "--budget",
        type=float,
        help="seconds after which no run is started (0: none, e.g. --budget 0 --table)",
    )
    p.add_argument(
        "--extra", action="append", default=[], help="override for every run (tests only)"
    )
    p.add_argument("--results", help="results directory, runs under RESULTS/runs (tests only)")
    return p


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs >= 1")
    return int(text)


def train_options(args) -> dict:
    """:func:`train_missing`'s keywords from the parsed options."""
    return {
        "jobs": args.jobs,
        "pin": not args.no_pin,
        "dry_run": args.dry_run,
        "budget": args.budget,
    }
