"""What a sweep found: one record per run (``sweep.jsonl``) and the table over seeds.

A run's record is read from its workdir: ``metrics.jsonl`` (the last eval is ``final``, the
eval best in the chosen metric is ``best``), whether its last checkpoint is the config's
``train.steps`` (``status``), and ``sweep_run.json``, which the sweep keeps per run: the
wall time of every process that trained it, added up, and the last exit code.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tfmjax.config.choices import LOWER_IS_BETTER
from tfmjax.config.compare import changes
from tfmjax.config.sections import Experiment
from tfmjax.reporting.metrics_log import METRICS_FILE, read_records
from tfmjax.sweep.grid import RunSpec

RESULTS_FILE = "sweep.jsonl"
RUN_FILE = "sweep_run.json"  # in each run's workdir: wall time and last exit code
DIVERGED = 1  # train.py's exit code for a non-finite loss


def is_finished(spec: RunSpec) -> bool:
    """Whether the run saved its last step: a checkpoint ``checkpoints/<step>`` with step >=
    ``train.steps`` (a save in progress or a corrupt step has a suffix and does not count)."""
    checkpoints = spec.workdir / "checkpoints"
    if not checkpoints.is_dir():
        return False
    steps = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and p.is_dir()]
    return max(steps, default=-1) >= spec.experiment.train.steps


def read_run_file(workdir: Path) -> dict:
    path = workdir / RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else {"wall_sec": 0.0, "exit": None}


def add_wall_time(workdir: Path, wall_sec: float, returncode: int) -> None:
    """Add one process's wall time to the run's total and note its exit code, atomically."""
    data = read_run_file(workdir)
    data = {"wall_sec": data["wall_sec"] + wall_sec, "exit": returncode}
    tmp = workdir / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, workdir / RUN_FILE)


def _status(spec: RunSpec, exit_code: int | None) -> str:
    if is_finished(spec):
        return "done"
    if exit_code == DIVERGED:
        return "diverged"
    return "unfinished" if exit_code in (None, 0, 130, 143) else "failed"


def _metrics(record: dict) -> dict:
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}


def run_record(spec: RunSpec, base: Experiment, metric: str) -> dict:
    """The run's ``sweep.jsonl`` record (see the module docstring)."""
    records = read_records(spec.workdir / METRICS_FILE)
    evals = [r for r in records if r.get("split") == "eval" and metric in r]
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    best = max(evals, key=lambda r: sign * r[metric], default=None)
    ran = read_run_file(spec.workdir)
    diff = {
        key: value
        for key, _, value in changes(base, spec.experiment)
        if key not in ("train.workdir",)
    }
    return {
        "run": spec.name,
        "point": dict(spec.point),
        "seed": spec.seed,
        "changes": diff,
        "workdir": str(spec.workdir),
        "status": _status(spec, ran["exit"]),
        "step": max((r["step"] for r in records if "step" in r), default=0),
        "final": {"step": evals[-1]["step"], **_metrics(evals[-1])} if evals else {},
        "best": {"step": best["step"], **_metrics(best)} if best else {},
        "wall_sec": round(ran["wall_sec"], 2),
    }


def write_results(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def summary(values: list[float]) -> dict:
    """``mean``, ``std`` (sample, n - 1; 0 for one value), ``min``, ``max``, ``n``."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return {"mean": mean, "std": math.sqrt(var), "min": min(values), "max": max(values), "n": n}


def by_point(records: list[dict]) -> dict[str, list[dict]]:
    """Records grouped by grid point name, in the sweep's order."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record["run"].rpartition("/seed=")[0], []).append(record)
    return groups


def table(records: list[dict], metric: str) -> str:
    """Per grid point: the final and best ``metric`` over seeds (mean ± std, min, max),
    the final loss and the mean wall time; runs without an eval are counted, not averaged."""
    header = f"{'point':<34} {'runs':>5}  {'final ' + metric:>24} {'min':>8} {'max':>8}"
    header += f"  {'best (mean)':>11}  {'final loss':>17}  {'wall s':>7}"
    lines = [header, "-" * len(header)]
    for name, group in by_point(records).items():
        finals = [r["final"][metric] for r in group if metric in r.get("final", {})]
        bests = [r["best"][metric] for r in group if metric in r.get("best", {})]
        losses = [r["final"]["loss"] for r in group if "loss" in r.get("final", {})]
        runs = f"{len(finals)}/{len(group)}"
        if not finals:
            lines.append(f"{name:<34} {runs:>5}  {'(no eval yet)':>24}")
            continue
        f, b = summary(finals), summary(bests)
        loss = summary(losses) if losses else None
        loss_text = f"{loss['mean']:.4f} ± {loss['std']:.4f}" if loss else "-"
        wall = sum(r["wall_sec"] for r in group) / len(group)
        lines.append(
            f"{name:<34} {runs:>5}  {f['mean']:>14.4f} ± {f['std']:.4f} {f['min']:>8.4f} "
            f"{f['max']:>8.4f}  {b['mean']:>11.4f}  {loss_text:>17}  {wall:>7.1f}"
        )
    return "\n".join(lines)
