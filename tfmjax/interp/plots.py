"""PNG figures for interpretability results: attention patterns, logit attribution, patching
sweeps, per-head scores, and curves over a run.

Each ``name(..., path)`` draws plain arrays (numpy or jax) into ``path`` and returns it as a
Path; ``name_figure(...)`` returns the matplotlib Figure instead (for a notebook, or to inspect).
Figures are built as ``matplotlib.figure.Figure`` and rendered by the Agg canvas directly, so
pyplot's global state and the session's chosen backend are left alone. A shape that does not
fit raises ValueError with one line naming the shape expected.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

DPI = 100
_MAX_GRID_COLS = 4


def _array(values, ndim: int, name: str, shape: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != ndim or 0 in a.shape:
        raise ValueError(f"{name} must have shape {shape} (non-empty), got {a.shape}")
    return a


def _labels(labels, n: int, name: str, shape: str) -> list[str] | None:
    if labels is None:
        return None
    labels = [str(v) for v in labels]
    if len(labels) != n:
        raise ValueError(f"{name} must have shape {shape} = [{n}], got [{len(labels)}]")
    return labels


def save(fig: Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` as a PNG to ``path`` (atomically, creating its folder); returns the Path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    FigureCanvasAgg(fig)
    fig.savefig(tmp, dpi=DPI, format="png")
    os.replace(tmp, path)
    return path


def _tick_labels(ax, x_labels, y_labels) -> None:
    if x_labels is not None:
        ax.set_xticks(range(len(x_labels)), x_labels, rotation=90, fontsize="x-small")
    if y_labels is not None:
        ax.set_yticks(range(len(y_labels)), y_labels, fontsize="x-small")


# ---------------------------------------------------------------------------------------------
# Attention patterns


def attention_patterns_figure(
    patterns,
    query_labels: Sequence | None = None,
    key_labels: Sequence | None = None,
    title: str = "",
    head_labels: Sequence | None = None,
) -> Figure:
    """One heatmap per head of ``patterns [N, T, S]`` (heads, queries, keys; T != S for
    cross-attention) on a shared 0..1 colour scale, in a grid of at most 4 columns.
    ``query_labels [T]`` / ``key_labels [S]`` label the rows / columns, ``head_labels [N]`` the
    panels (default "head i"). The figure's axes are the N heads, then one colorbar."""
    p = _array(patterns, 3, "patterns", "[N, T, S] (heads, queries, keys)")
    n, t, s = p.shape
    q_lab = _labels(query_labels, t, "query_labels", "[T]")
    k_lab = _labels(key_labels, s, "key_labels", "[S]")
    h_lab = _labels(head_labels, n, "head_labels", "[N]") or [f"head {i}" for i in range(n)]
    cols = min(n, _MAX_GRID_COLS)
    rows = math.ceil(n / cols)
    # Square cells: each panel about 2.5 inches on its longer side.
    cell = 2.5 / max(t, s)
    panel_w, panel_h = max(s * cell, 1.0) + 0.6, max(t * cell, 1.0) + 0.6
    fig = Figure(figsize=(cols * panel_w + 1.0, rows * panel_h + 0.4), layout="constrained")
    axes = []
    image = None
    for i in range(n):
        ax = fig.add_subplot(rows, cols, i + 1)
        image = ax.imshow(p[i], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(h_lab[i], fontsize="small")
        if q_lab is None and k_lab is None:
            ax.tick_params(labelsize="x-small")
        _tick_labels(ax, k_lab, q_lab)
        axes.append(ax)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention")
    if title:
        fig.suptitle(title)
    return fig


def attention_patterns(
    patterns,
    path: str | os.PathLike,
    query_labels: Sequence | None = None,
    key_labels: Sequence | None = None,
    title: str = "",
    head_labels: Sequence | None = None,
) -> Path:
    """``attention_patterns_figure`` written to ``path`` (PNG); returns the Path."""
    return save(
        attention_patterns_figure(patterns, query_labels, key_labels, title, head_labels), path
    )


# ---------------------------------------------------------------------------------------------
# Logit attribution


def logit_attribution_figure(
    names: Sequence,
    values,
    title: str = "",
    sort: bool = True,
    top_k: int | None = None,
) -> Figure:
    """Horizontal bars of ``values [C]`` named by ``names [C]`` (e.g. each component's direct
    effect on a logit difference), positive blue and negative red. With ``sort`` the largest
    |value| is on top; ``top_k`` keeps only the k largest |value| (and implies sort)."""
    v = _array(values, 1, "values", "[C]")
    c = v.shape[0]
    n = _labels(names, c, "names", "[C]")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    order = np.arange(c)
    if sort or top_k is not None:
        order = np.argsort(-np.abs(v), kind="stable")
    if top_k is not None:
        order = order[:top_k]
    v, n = v[order], [n[i] for i in order]
    k = len(order)
    fig = Figure(figsize=(7.0, 1.2 + 0.28 * k), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(k)[::-1]  # first entry at the top
    ax.barh(y, v, color=np.where(v >= 0, "tab:blue", "tab:red"))
    ax.set_yticks(y, n, fontsize="small")
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel("attribution")
    if title:
        ax.set_title(title)
    return fig


def logit_attribution(
    names: Sequence,
    values,
    path: str | os.PathLike,
    title: str = "",
    sort: bool = True,
    top_k: int | None = None,
) -> Path:
    """``logit_attribution_figure`` written to ``path`` (PNG); returns the Path."""
    return save(logit_attribution_figure(names, values, title, sort, top_k), path)


# ---------------------------------------------------------------------------------------------
# Patching heatmap


def patching_heatmap_figure(
    values,
    row_labels: Sequence | None = None,
    col_labels: Sequence | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
) -> Figure:
    """Heatmap of ``values [L, X]`` (e.g. the patching effect per layer and position) in a
    diverging colormap centred at 0 (symmetric limits ±max|value|; NaN cells left blank).
    ``row_labels [L]`` / ``col_labels [X]`` label the rows / columns."""
    v = _array(values, 2, "values", "[L, X]")
    rows, cols = v.shape
    r_lab = _labels(row_labels, rows, "row_labels", "[L]")
    c_lab = _labels(col_labels, cols, "col_labels", "[X]")
    finite = np.abs(v[np.isfinite(v)])
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    cell = min(0.45, 8.0 / cols, 6.0 / rows)
    fig = Figure(figsize=(cols * cell + 2.2, rows * cell + 1.4), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(
        np.ma.masked_invalid(v),
        cmap="RdBu",
        vmin=-vmax,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
    )
    _tick_labels(ax, c_lab, r_lab)
    fig.colorbar(image, ax=ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return fig


def patching_heatmap(
    values,
    path: str | os.PathLike,
    row_labels: Sequence | None = None,
    col_labels: Sequence | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
) -> Path:
    """``patching_heatmap_figure`` written to ``path`` (PNG); returns the Path."""
    return save(
        patching_heatmap_figure(values, row_labels, col_labels, title, xlabel, ylabel), path
    )


# ---------------------------------------------------------------------------------------------
# Per-head scores


def head_scores_figure(
    scores: Mapping[str, object], title: str = "", annotate: bool = True
) -> Figure:
    """Side by side, one heatmap per entry of ``scores`` (a kind of score -> [L, N], layers by
    heads, all the same shape), each on its own colour scale, with each cell's value written
    in it when ``annotate``. The figure's axes are one per kind, then one colorbar per kind."""
    if not scores:
        raise ValueError("scores must map at least one name to an array of shape [L, N]")
    arrays = {}
    shape = None
    for name, s in scores.items():
        a = _array(s, 2, f"scores[{name!r}]", "[L, N] (layers, heads)")
        if shape is not None and a.shape != shape:
            raise ValueError(
                f"scores[{name!r}] must have shape [L, N] = {list(shape)}, got {a.shape}"
            )
        shape = a.shape
        arrays[str(name)] = a
    layers, heads = shape
    cell = min(0.55, 6.0 / heads, 6.0 / layers)
    panel_w, panel_h = heads * cell + 1.6, layers * cell + 1.2
    fig = Figure(figsize=(len(arrays) * panel_w, panel_h), layout="constrained")
    for i, (name, a) in enumerate(arrays.items()):
        ax = fig.add_subplot(1, len(arrays), i + 1)
        finite = a[np.isfinite(a)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        norm = Normalize(lo, hi if hi > lo else lo + 1.0)
        image = ax.imshow(
            np.ma.masked_invalid(a), cmap="viridis", norm=norm, interpolation="nearest"
        )
        ax.set_title(name)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(heads))
        ax.set_yticks(range(layers))
        ax.tick_params(labelsize="x-small")
        if annotate:
            for (r, c), val in np.ndenumerate(a):
                if np.isfinite(val):
                    ax.text(
                        c,
                        r,
                        f"{val:.2f}",
                        ha="center",
                        va="center",
                        fontsize="xx-small",
                        color="black" if norm(val) > 0.5 else "white",
                    )
        fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig


def head_scores(
    scores: Mapping[str, object],
    path: str | os.PathLike,
    title: str = "",
    annotate: bool = True,
) -> Path:
    """``head_scores_figure`` written to ``path`` (PNG); returns the Path."""
    return save(head_scores_figure(scores, title, annotate), path)


# ---------------------------------------------------------------------------------------------
# Curves


def curves_figure(
    steps,
    series: Mapping[str, object],
    title: str = "",
    xlabel: str = "step",
    ylabel: str = "",
    mark: float | None = None,
) -> Figure:
    """One line per entry of ``series`` (name -> values [S]) against ``steps [S]``, e.g. the
    induction score at each of a run's checkpoints; ``mark`` draws a dashed vertical line at
    that step."""
    x = _array(steps, 1, "steps", "[S]")
    if not series:
        raise ValueError("series must map at least one name to an array of shape [S]")
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for name, ys in series.items():
        y = np.asarray(ys, dtype=np.float64)
        if y.shape != x.shape:
            raise ValueError(
                f"series[{name!r}] must have shape [S] = [{x.shape[0]}], got {y.shape}"
            )
        ax.plot(x, y, marker="." if x.shape[0] <= 50 else None, label=str(name))
    if mark is not None:
        ax.axvline(
            float(mark),
            color="gray",
            linestyle="--",
            linewidth=1.0,
            label=f"{xlabel} {mark:g}".strip(),
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return fig


def curves(
    steps,
    series: Mapping[str, object],
    path: str | os.PathLike,
    title: str = "",
    xlabel: str = "step",
    ylabel: str = "",
    mark: float | None = None,
) -> Path:
    """``curves_figure`` written to ``path`` (PNG); returns the Path."""
    return save(curves_figure(steps, series, title, xlabel, ylabel, mark), path)
