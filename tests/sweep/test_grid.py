"""Grid expansion, run naming, the one-line errors, and the table's statistics (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tfmjax.config import ConfigError
from tfmjax.sweep.cli import main
from tfmjax.sweep.grid import (
    Axis,
    expand,
    parse_axes,
    parse_seeds,
    point_name,
    short_names,
)
from tfmjax.sweep.results import is_finished, summary, table

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "reverse.toml"


def test_seeds_lists_and_ranges():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds("3-5") == [3, 4, 5]
    for bad in ("a", "1,1", "-1", "2-1", ""):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_axes_keep_the_values_as_written():
    axes = parse_axes(["optim.learning_rate=1e-3, 3e-3", "model.position=rope,alibi"], [])
    assert axes == [
        Axis("optim.learning_rate", ("1e-3", "3e-3")),
        Axis("model.position", ("rope", "alibi")),
    ]


@pytest.mark.parametrize(
    "grids, overrides, match",
    [
        (["optim.learning_rate"], [], "must look like section.key=value"),
        (["learning_rate=1e-3"], [], "must look like section.key=value"),
        (["optim.learning_rate=1e-3,"], [], "empty value"),
        (["optim.learning_rate=1e-3,1e-3"], [], "repeats a value"),
        (["train.seed=1,2"], [], "use --seeds"),
        (["train.workdir=a,b"], [], "use --workdir"),
        (["optim.learning_rate=1e-3", "optim.learning_rate=2e-3"], [], "set twice"),
        (["optim.learning_rate=1e-3"], ["optim.learning_rate=2e-3"], "set twice"),
    ],
)
def test_malformed_grids_are_one_line(grids, overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        parse_axes(grids, overrides)
    assert "\n" not in str(err.value)


def test_short_names_stay_unique():
    axes = [Axis("model.dropout_rate", ("0.1",)), Axis("optim.learning_rate", ("1",))]
    assert short_names(axes) == {
        "model.dropout_rate": "dropout_rate",
        "optim.learning_rate": "learning_rate",
    }
    twins = [Axis("a.x", ("1",)), Axis("b.x", ("2",))]
    assert short_names(twins) == {"a.x": "a.x", "b.x": "b.x"}
    assert point_name((), {}) == "base"
    assert point_name((("data.task", "a/b"),), {"data.task": "task"}) == "task=a_b"


def test_expand_is_every_point_times_every_seed(tmp_path):
    axes = parse_axes(["optim.learning_rate=1e-3,3e-3", "model.position=rope,alibi"], [])
    runs = expand(CONFIG, ["train.steps=7"], axes, [0, 5], tmp_path)
    assert len(runs) == 2 * 2 * 2
    assert len({r.workdir for r in runs}) == len(runs)
    by_name = {r.name: r for r in runs}
    run = by_name["learning_rate=3e-3,position=alibi/seed=5"]
    assert run.workdir == tmp_path / "learning_rate=3e-3,position=alibi" / "seed=5"
    exp = run.experiment
    assert (exp.optim.learning_rate, exp.model.position, exp.train.seed) == (3e-3, "alibi", 5)
    assert exp.train.steps == 7 and exp.workdir == str(run.workdir)
    assert run.overrides[0] == "train.steps=7"


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--grid", "optim.learnin_rate=1e-3"], "optim.learnin_rate"),
        (["--grid", "model.position=rope,alibo"], "alibo"),
        (["--grid", "optim.learning_rate=fast"], "optim.learning_rate"),
        (["modl.d_model=3"], "modl"),
        (["--seeds", "x"], "--seeds"),
        (["--metric", "bleu"], "bleu"),
    ],
)
def test_cli_names_a_bad_key_or_value_in_one_line_before_training(argv, named, tmp_path, capsys):
    assert main([str(CONFIG), "--workdir", str(tmp_path / "s"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and named in err
    assert not (tmp_path / "s").exists()  # nothing made, nothing trained


def test_a_point_is_finished_when_its_last_step_is_saved(tmp_path):
    (run,) = expand(CONFIG, ["train.steps=20"], [], [0], tmp_path)
    assert not is_finished(run)
    (run.workdir / "checkpoints" / "10").mkdir(parents=True)
    assert not is_finished(run)
    (run.workdir / "checkpoints" / "20.orbax-checkpoint-tmp").mkdir()  # a save in progress
    assert not is_finished(run)
    (run.workdir / "checkpoints" / "30").mkdir()  # train.steps lowered since: done too
    assert is_finished(run)


def test_summary_matches_numpy():
    values = [0.25, 0.5, 1.0]
    s = summary(values)
    assert s["mean"] == pytest.approx(np.mean(values), rel=1e-12)
    assert s["std"] == pytest.approx(np.std(values, ddof=1), rel=1e-12)
    assert (s["min"], s["max"], s["n"]) == (0.25, 1.0, 3)
    assert summary([2.0])["std"] == 0.0


def test_table_has_one_row_per_point_with_its_seeds_statistics():
    records = [
        {"run": f"lr={lr}/seed={s}", "final": {"exact_match": v, "loss": 1.0}, "wall_sec": 2.0}
        for lr, s, v in [("1", 0, 0.2), ("1", 1, 0.4), ("2", 0, 0.9)]
    ]
    records = [dict(r, best=r["final"]) for r in records]
    records.append({"run": "lr=3/seed=0", "final": {}, "best": {}, "wall_sec": 0.0})
    lines = table(records, "exact_match").splitlines()
    assert len(lines) == 2 + 3
    row = lines[2].split()
    assert row[:3] == ["lr=1", "2/2", "0.3000"]
    assert row[4] == f"{np.std([0.2, 0.4], ddof=1):.4f}" and row[5:7] == ["0.2000", "0.4000"]
    assert "(no eval yet)" in lines[4]
    json.dumps(records)  # records are plain JSON


def test_one_program_per_shape_the_numbers_stacked_within_it(tmp_path):
    """--executor vmap groups: learning rate, weight decay, warmup, dropout rate, label
    smoothing and seed vary within a program; a width, a depth or a position encoding
    starts another (8 groups of one shape each, both learning rates in each)."""
    from tfmjax.sweep.stacked import by_shape

    numbers = parse_axes(
        [
            "optim.learning_rate=1e-3,3e-3",
            "model.dropout_rate=0.0,0.1",
            "optim.label_smoothing=0.0,0.1",
            "optim.weight_decay=0.0,0.1",
            "optim.warmup_steps=0,5",
        ],
        [],
    )
    runs = expand(CONFIG, ["train.steps=7"], numbers, [0, 1], tmp_path)
    assert [len(group) for group in by_shape(runs)] == [2**5 * 2]
    shapes = parse_axes(
        ["model.d_model=16,32", "model.num_layers=1,2", "model.position=rope,alibi"], []
    )
    runs = expand(CONFIG, ["train.steps=7"], [numbers[0], *shapes], [0], tmp_path)
    groups = by_shape(runs)
    assert [len(group) for group in groups] == [2] * 8
    for group in groups:  # each group: one shape, both learning rates, both seeds
        assert len({dict(spec.point)["model.d_model"] for spec in group}) == 1
        assert len({dict(spec.point)["model.position"] for spec in group}) == 1
        assert [dict(spec.point)["optim.learning_rate"] for spec in group] == ["1e-3", "3e-3"]
