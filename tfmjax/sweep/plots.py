"""A sweep's figures: the chosen metric against each swept value (mean over seeds, error bars
one standard deviation) and learning curves per grid point (each seed thin, their mean thick).

``metric.png``: one panel per grid axis (the seeds' axis when nothing else is swept); x is
that axis's values in the order given, one line per combination of the other axes' values.
``curves.png``: one column per grid point, the eval metric on top, the train loss below.
"""

from __future__ import annotations

import os
from pathlib import Path

from tfmjax.reporting.metrics_log import METRICS_FILE, read_records
from tfmjax.sweep.grid import Axis
from tfmjax.sweep.results import by_point, summary

METRIC_PLOT = "metric.png"
CURVES_PLOT = "curves.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> Path:
    tmp = out.with_name(f".{out.name}.tmp")  # atomic: a kill never leaves half a PNG
    fig.savefig(tmp, dpi=100, format="png")
    os.replace(tmp, out)
    return out


def _final(records: list[dict], metric: str) -> list[float]:
    return [r["final"][metric] for r in records if metric in r.get("final", {})]


def _axis_panel(ax, axis: Axis, axes: list[Axis], records: list[dict], metric: str) -> None:
    others = [a for a in axes if a.key != axis.key]
    lines: dict[tuple, list[tuple[int, dict]]] = {}
    for i, value in enumerate(axis.values):
        at = [r for r in records if r["point"].get(axis.key) == value]
        for rest in sorted({tuple(r["point"][a.key] for a in others) for r in at}):
            chosen = [r for r in at if tuple(r["point"][a.key] for a in others) == rest]
            finals = _final(chosen, metric)
            if finals:
                lines.setdefault(rest, []).append((i, summary(finals)))
    for rest, points in lines.items():
        named = zip(others, rest, strict=True)
        label = ",".join(f"{a.key.rpartition('.')[2]}={v}" for a, v in named)
        ax.errorbar(
            [i for i, _ in points],
            [s["mean"] for _, s in points],
            yerr=[s["std"] for _, s in points],
            marker="o",
            capsize=4,
            label=label or None,
        )
    ax.set_xticks(range(len(axis.values)), axis.values)
    ax.set_xlabel(axis.key)
    ax.set_ylabel(f"final eval {metric}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def plot_metric(out: Path, axes: list[Axis], records: list[dict], metric: str) -> Path | None:
    """``metric`` against each swept value, error bars over seeds; None if no run has it."""
    if not _final(records, metric):
        return None
    plt = _pyplot()
    if not axes:  # seeds only: one point, the seeds' mean and spread
        axes = [Axis("seeds", ("base",))]
        records = [dict(r, point={"seeds": "base"}) for r in records]
    fig, panels = plt.subplots(1, len(axes), figsize=(5 * len(axes), 4), squeeze=False)
    for ax, axis in zip(panels[0], axes, strict=True):
        _axis_panel(ax, axis, axes, records, metric)
    fig.suptitle(f"final eval {metric}: mean ± std over seeds")
    fig.tight_layout()
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)


def _curve(records: list[dict], split: str, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in records if r.get("split") == split and key in r}


def _curves_panel(ax, workdirs: list[Path], split: str, key: str) -> None:
    curves = [_curve(read_records(Path(w) / METRICS_FILE), split, key) for w in workdirs]
    curves = [c for c in curves if c]
    for curve in curves:
        ax.plot(list(curve), list(curve.values()), lw=0.8, alpha=0.5, color="C0")
    shared = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    if shared:
        mean = [sum(c[s] for c in curves) / len(curves) for s in shared]
        ax.plot(shared, mean, lw=2.5, color="C1", label=f"mean of {len(curves)}")
        ax.legend(fontsize="small")
    ax.set_xlabel("step")
    ax.set_ylabel(f"{split} {key}")
    ax.grid(alpha=0.3)


def plot_curves(out: Path, records: list[dict], metric: str) -> Path | None:
    """Eval ``metric`` (top) and train loss (bottom) per grid point; None before any record."""
    groups = by_point(records)
    if not any(r["step"] for r in records):
        return None
    plt = _pyplot()
    fig, panels = plt.subplots(2, len(groups), figsize=(4 * len(groups), 6), squeeze=False)
    for column, (name, group) in enumerate(groups.items()):
        workdirs = [Path(r["workdir"]) for r in group]
        _curves_panel(panels[0][column], workdirs, "eval", metric)
        _curves_panel(panels[1][column], workdirs, "train", "loss")
        panels[0][column].set_title(name, fontsize="small")
        panels[1][column].set_yscale("log")
    fig.tight_layout()
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)
