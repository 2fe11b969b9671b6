"""The interpretability figures: each writes a readable PNG of the expected proportions, the
pattern grid has one panel per head, and misshapen input raises ValueError."""

import matplotlib
import matplotlib.image
import numpy as np
import pytest

from tfmjax.interp import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(path, fig_size_inches):
    """Checks the file is a PNG matplotlib reads back at the figure's size; returns the image."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    want_w, want_h = (round(v * plots.DPI) for v in fig_size_inches)
    assert abs(width - want_w) <= 2 and abs(height - want_h) <= 2
    assert image[..., :3].std() > 0.01  # something was drawn
    return image


def head_axes(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def patterns(n, t, s, seed=0):
    x = np.random.default_rng(seed).random((n, t, s))
    return x / x.sum(axis=-1, keepdims=True)


def test_attention_patterns_png_and_one_panel_per_head(tmp_path):
    p = patterns(6, 5, 5)
    path = plots.attention_patterns(
        p, tmp_path / "sub" / "attn.png", title="L0", key_labels="abcde"
    )
    assert path == tmp_path / "sub" / "attn.png"
    fig = plots.attention_patterns_figure(p, title="L0", key_labels="abcde")
    image = read_png(path, fig.get_size_inches())
    assert image.shape[1] > image.shape[0]  # 4 columns by 2 rows: wider than tall
    axes = head_axes(fig)
    assert len(axes) == 6 and len(fig.axes) == 7  # the heads, then the colorbar
    assert [ax.get_title() for ax in axes] == [f"head {i}" for i in range(6)]
    np.testing.assert_allclose(axes[4].images[0].get_array(), p[4])
    assert [t.get_text() for t in axes[0].get_xticklabels()] == list("abcde")


def test_attention_patterns_cross_attention_and_single_head(tmp_path):
    # T=3 queries over S=9 keys: each panel is wider than tall.
    fig = plots.attention_patterns_figure(patterns(2, 3, 9), query_labels=["x", "y", "z"])
    assert len(head_axes(fig)) == 2
    assert head_axes(fig)[0].images[0].get_array().shape == (3, 9)
    path = plots.attention_patterns(patterns(1, 3, 9), tmp_path / "cross.png")
    one = plots.attention_patterns_figure(patterns(1, 3, 9))
    assert len(head_axes(one)) == 1
    read_png(path, one.get_size_inches())


def test_logit_attribution_sorted_and_top_k(tmp_path):
    names = ["embed", "L0H0", "L0H1", "L1H0", "mlp0"]
    values = np.array([0.1, -2.0, 0.5, 3.0, -0.2])
    path = plots.logit_attribution(names, values, tmp_path / "attr.png", title="logit diff")
    read_png(path, plots.logit_attribution_figure(names, values).get_size_inches())
    ax = plots.logit_attribution_figure(names, values, top_k=3).axes[0]
    bars = sorted(ax.patches, key=lambda b: -b.get_y())  # top to bottom
    assert [b.get_width() for b in bars] == [3.0, -2.0, 0.5]
    labels = sorted(ax.get_yticklabels(), key=lambda t: -t.get_position()[1])
    assert [t.get_text() for t in labels] == ["L1H0", "L0H0", "L0H1"]
    ax = plots.logit_attribution_figure(names, values, sort=False).axes[0]
    assert [b.get_width() for b in sorted(ax.patches, key=lambda b: -b.get_y())] == list(values)


def test_patching_heatmap_is_centred_at_zero(tmp_path):
    values = np.array([[0.5, -1.5, 0.0, 0.25], [1.0, np.nan, -0.2, 0.1]])
    path = plots.patching_heatmap(
        values, tmp_path / "patch.png", row_labels=["L0", "L1"], xlabel="position"
    )
    fig = plots.patching_heatmap_figure(values, row_labels=["L0", "L1"], xlabel="position")
    read_png(path, fig.get_size_inches())
    image = head_axes(fig)[0].images[0]
    assert image.get_clim() == (-1.5, 1.5)
    assert image.get_cmap().name == "RdBu"
    assert plots.patching_heatmap_figure(np.zeros((2, 3))).axes[0].images[0].get_clim() == (-1, 1)


def test_head_scores_side_by_side_with_annotations(tmp_path):
    rng = np.random.default_rng(0)
    scores = {"induction": rng.random((2, 3)), "prev token": rng.random((2, 3))}
    path = plots.head_scores(scores, tmp_path / "scores.png", title="heads")
    fig = plots.head_scores_figure(scores)
    image = read_png(path, fig.get_size_inches())
    assert image.shape[1] > image.shape[0]
    axes = head_axes(fig)
    assert [ax.get_title() for ax in axes] == ["induction", "prev token"]
    texts = [t.get_text() for t in axes[1].texts]
    assert len(texts) == 6 and f"{scores['prev token'][1, 2]:.2f}" in texts
    assert not head_axes(plots.head_scores_figure(scores, annotate=False))[0].texts


def test_curves_with_mark(tmp_path):
    steps = np.arange(0, 1000, 100)
    series = {"induction score": np.linspace(0, 1, 10), "loss": np.linspace(3, 1, 10)}
    path = plots.curves(steps, series, tmp_path / "curves.png", mark=400, ylabel="score")
    fig = plots.curves_figure(steps, series, mark=400)
    image = read_png(path, fig.get_size_inches())
    assert image.shape[1] / image.shape[0] == pytest.approx(7 / 4, rel=0.02)
    ax = fig.axes[0]
    assert len(ax.lines) == 3  # two series and the marker
    assert list(ax.lines[2].get_xdata()) == [400, 400]
    assert len(plots.curves_figure(steps, series).axes[0].lines) == 2


@pytest.mark.parametrize(
    "call, shape",
    [
        (lambda p: plots.attention_patterns(np.zeros((4, 4)), p), r"\[N, T, S\]"),
        (lambda p: plots.attention_patterns(np.zeros((2, 3, 4)), p, query_labels="ab"), r"\[T\]"),
        (lambda p: plots.attention_patterns(np.zeros((2, 3, 4)), p, key_labels="abc"), r"\[S\]"),
        (lambda p: plots.logit_attribution(["a", "b"], [1.0, 2.0, 3.0], p), r"\[C\]"),
        (lambda p: plots.logit_attribution(["a"], [[1.0]], p), r"\[C\]"),
        (lambda p: plots.logit_attribution(["a"], [1.0], p, top_k=0), "top_k"),
        (lambda p: plots.patching_heatmap(np.zeros(5), p), r"\[L, X\]"),
        (lambda p: plots.patching_heatmap(np.zeros((2, 3)), p, col_labels="ab"), r"\[X\]"),
        (lambda p: plots.head_scores({"a": np.zeros((2, 3, 1))}, p), r"\[L, N\]"),
        (
            lambda p: plots.head_scores({"a": np.zeros((2, 3)), "b": np.zeros((3, 2))}, p),
            r"\[L, N\]",
        ),
        (lambda p: plots.head_scores({}, p), r"\[L, N\]"),
        (lambda p: plots.curves(np.arange(4), {"a": np.zeros(5)}, p), r"\[S\]"),
        (lambda p: plots.curves(np.zeros((2, 2)), {"a": np.zeros(2)}, p), r"\[S\]"),
    ],
)
def test_mismatched_shapes_raise(tmp_path, call, shape):
    path = tmp_path / "bad.png"
    with pytest.raises(ValueError, match=shape) as err:
        call(path)
    assert "\n" not in str(err.value)
    assert not path.exists()


def test_module_leaves_pyplot_and_backend_alone():
    backend = matplotlib.get_backend()
    plots.curves_figure([0, 1], {"a": [0, 1]})
    assert matplotlib.get_backend() == backend
    import sys

    if "matplotlib.pyplot" in sys.modules:  # imported by someone else: no figure left open
        assert not sys.modules["matplotlib.pyplot"].get_fignums()
