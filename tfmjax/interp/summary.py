"""What ``python -m tfmjax.interp`` prints after a command: a few readable lines of its report
(the top heads, the top attributions, ...) and the files it wrote; the whole report is in
``interp.json``."""

from __future__ import annotations

import numpy as np

TOP = 5  # attributions, heads and grid cells shown


def summary_lines(command: str, report: dict) -> list[str]:
    """The lines for ``command``'s ``report`` (as :mod:`tfmjax.interp.cli` builds it)."""
    lines = _LINES[command](report)
    return [line for line in lines if line]


def _head(top: dict) -> str:
    return f"L{top['layer']}H{top['head']} {top['score']:.3f}"


def _heads(report: dict) -> list[str]:
    return [
        f"{stack} top heads: "
        + ", ".join(f"{score} {_head(top)}" for score, top in scores["top"].items())
        for stack, scores in report.items()
    ]


def _patterns(report: dict) -> list[str]:
    alignment = report.get("alignment")
    mean = f"; mean alignment share {np.mean(alignment['share']):.3f}" if alignment else ""
    return [f"{len(report['files'])} attention-pattern plots{mean}"]


def _dla(report: dict) -> list[str]:
    top = ", ".join(f"{name} {value:+.3f}" for name, value in report["top"][:TOP])
    return [
        f"answer logit {report['answer_logit']:.3f} = sum of the parts {report['sum']:.3f}",
        f"largest parts: {top}",
    ]


def _patch(report: dict) -> list[str]:
    lines = []
    for name, grid in report["grids"].items():
        values = np.asarray(grid, dtype=float)
        where = np.unravel_index(int(np.nanargmax(values)), values.shape)
        at = "layer " + str(where[0]) + "".join(f", position {i}" for i in where[1:])
        lines.append(f"{name}: most restored {np.nanmax(values):.3f} at {at}")
    return lines


def _ablate(report: dict) -> list[str]:
    single = report["single_head_ablations"]
    heads = [f"{stack} L{layer}H{head}" for stack, layer, head in report["ablated_together"]]
    together = report["exact_match_ablated_together"]
    shown = ", ".join(heads[:TOP]) + (f" and {len(heads) - TOP} more" if len(heads) > TOP else "")
    return [
        f"exact match {single['baseline']:.3f} (chance {report['chance']:.3f})",
        f"heads scoring >= {report['threshold']}: {shown or 'none'}"
        + (f"; all of them mean-ablated: exact match {together:.3f}" if heads else ""),
    ]


def _sae(report: dict) -> list[str]:
    loss = report["answer_loss"]
    return [
        f"{report['hook']}: loss recovered {report['loss_recovered']:.3f} (answer loss clean "
        f"{loss['clean']:.3f}, spliced {loss['spliced']:.3f}, zero-ablated "
        f"{loss['zero_ablated']:.3f}); L0 {report['metrics']['l0']:.1f}"
    ]


def _phase(report: dict) -> list[str]:
    jumps = ", ".join(
        f"{score} {jump['from']:.3f} -> {jump['to']:.3f} at step {jump['step']}"
        for score, jump in report["largest_jump"].items()
    )
    return [f"{len(report['steps'])} checkpoints; largest jumps: {jumps}"]


_LINES = {
    "heads": _heads,
    "patterns": _patterns,
    "dla": _dla,
    "patch": _patch,
    "ablate": _ablate,
    "sae": _sae,
    "phase": _phase,
}
