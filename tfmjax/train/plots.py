"""Loss, accuracy and learning-rate curves from ``metrics.jsonl``, as one PNG.

``python -m tfmjax.train.plots WORKDIR`` writes ``WORKDIR/metrics.png`` (the training
loop does the same at its end).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tfmjax.reporting.metrics_log import METRICS_FILE, read_records

PLOT_FILE = "metrics.png"


def _series(records: list[dict], split: str, key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get("split") == split and key in r]
    return [p[0] for p in points], [p[1] for p in points]


def _panel(ax, records, title: str, lines: list[tuple[str, str, str]], log_y: bool = False):
    for split, key, label in lines:
        x, y = _series(records, split, key)
        if x:
            ax.plot(x, y, marker="." if split == "eval" else None, label=label)
    ax.set_title(title)
    ax.set_xlabel("step")
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def plot_metrics(workdir: str | Path, out: str | Path | None = None) -> Path | None:
    """Draw ``workdir/metrics.jsonl`` into ``out`` (default ``workdir/metrics.png``).

    Returns the file written, or None (nothing drawn) while there is no train or eval record
    yet, e.g. a run stopped before its first log step.
    """
    workdir = Path(workdir)
    records = read_records(workdir / METRICS_FILE)
    if not any(r.get("split") in ("train", "eval") for r in records):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss, acc, lr) = plt.subplots(1, 3, figsize=(15, 4))
    _panel(
        loss,
        records,
        "loss (NLL per target token)",
        [("train", "loss", "train"), ("eval", "loss", "eval")],
        log_y=True,
    )
    _panel(
        acc,
        records,
        "accuracy",
        [
            ("train", "token_accuracy", "train token"),
            ("eval", "token_accuracy", "eval token"),
            ("eval", "exact_match", "eval exact match (greedy)"),
        ],
    )
    acc.set_ylim(-0.02, 1.02)
    _panel(lr, records, "learning rate", [("train", "learning_rate", "lr")])
    fig.tight_layout()
    out = Path(out) if out is not None else workdir / PLOT_FILE
    tmp = out.with_name(f".{out.name}.tmp")  # atomic: a kill never leaves half a PNG
    fig.savefig(tmp, dpi=100, format=out.suffix[1:] or None)
    plt.close(fig)
    os.replace(tmp, out)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfmjax.train.plots", description=__doc__.splitlines()[0]
    )
    parser.add_argument("workdir", help="a training workdir holding metrics.jsonl")
    args = parser.parse_args(argv)
    written = plot_metrics(args.workdir)
    if written is None:
        print(f"error: no metrics in {Path(args.workdir) / METRICS_FILE}", file=sys.stderr)
        return 2
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
