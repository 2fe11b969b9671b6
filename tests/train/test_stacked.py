"""Runs that differ only in their seed, trained as one vmapped program, against each run
trained alone by the loop: every metrics record (timing aside) and the final params within
1e-5 relative, for both families with dropout on; each checkpoint an ordinary one."""

from __future__ import annotations

import io
from pathlib import Path

import jax
import numpy as np
import pytest

from tfmjax.checkpoint import load_for_inference
from tfmjax.config import ConfigError, load
from tfmjax.reporting.metrics_log import deterministic_part, read_records
from tfmjax.train.loop import train
from tfmjax.train.run import HYPERPARAMETERS
from tfmjax.train.stacked import stackable, train_stacked, varying

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model.d_model=16",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.d_ff=32",
    "model.dropout_rate=0.1",
    "data.batch_size=8",
    "data.eval_examples=16",
    "train.steps=12",
    "train.log_every=4",
    "train.eval_every=6",
    "train.checkpoint_every=6",
    "optim.warmup_steps=2",
]
RTOL = 1e-5


def _experiments(config: str, workdir: Path, seeds=(0, 1)):
    return [
        load(ROOT / config, [*TINY, f"train.seed={s}", f"train.workdir={workdir / str(s)}"])
        for s in seeds
    ]


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=RTOL, abs=1e-7), path
    else:
        assert a == b, path


def _assert_equals_run_alone(exp_s, exp_a, records: int):
    """Every metrics record (timing aside) and the final params of the run trained in the
    group ``exp_s`` within 1e-5 relative of the same run trained alone, ``exp_a``."""
    train(exp_a, stream=io.StringIO(), plot=False)
    got = [deterministic_part(r) for r in read_records(Path(exp_s.workdir) / "metrics.jsonl")]
    want = [deterministic_part(r) for r in read_records(Path(exp_a.workdir) / "metrics.jsonl")]
    assert len(got) == len(want) == records
    for g, w in zip(got, want, strict=True):
        _close(g, w)
    _, params_s, step_s = load_for_inference(exp_s.workdir)
    _, params_a, step_a = load_for_inference(exp_a.workdir)
    assert step_s == step_a == exp_a.train.steps
    flat_s = jax.tree_util.tree_flatten_with_path(params_s)[0]
    flat_a = jax.tree_util.tree_flatten_with_path(params_a)[0]
    far = []
    for (path, s), (_, a) in zip(flat_s, flat_a, strict=True):
        name = jax.tree_util.keystr(path)
        # relative to each element and to the leaf's scale: a near-zero element of a leaf
        # (one of 2,048 in a position table, 2.6e-7 off on jax 0.11) is rounding, not drift
        scale = float(np.max(np.abs(np.asarray(a))))
        if not np.allclose(np.asarray(s), np.asarray(a), rtol=RTOL, atol=max(RTOL * scale, 1e-7)):
            far.append(name)
    # A key bias shifts every score of a query alike, which softmax ignores: its gradient
    # is rounding noise, which Adam scales to steps of the learning rate's size; batched
    # kernels round differently, so it alone goes elsewhere (the records above agree).
    assert all(name.endswith("['key']['bias']") for name in far), far


@pytest.mark.parametrize("config", ["configs/reverse.toml", "configs/reverse_decoder.toml"])
def test_stacked_runs_equal_runs_trained_alone(config, tmp_path):
    stacked = _experiments(config, tmp_path / "stacked")
    alone = _experiments(config, tmp_path / "alone")
    assert train_stacked(stacked, streams=[io.StringIO(), io.StringIO()], plot=False) == {
        "step": 12,
        "stopped": False,
    }
    for exp_s, exp_a in zip(stacked, alone, strict=True):
        _assert_equals_run_alone(exp_s, exp_a, 3 + 2)


# Three runs of one shape and their own numbers: run 0 with no dropout, no smoothing and no
# decay (the Python skips of a plain run) beside runs with them; warmups that differ.
HYPER_RUNS = [
    ["optim.learning_rate=3e-3", "model.dropout_rate=0.0", "optim.label_smoothing=0.0"],
    [
        "optim.learning_rate=1e-2",
        "model.dropout_rate=0.1",
        "optim.label_smoothing=0.1",
        "optim.weight_decay=0.1",
        "optim.warmup_steps=0",
    ],
    ["optim.learning_rate=1e-3", "model.dropout_rate=0.3", "optim.label_smoothing=0.2"],
]


def test_runs_with_their_own_rates_dropout_and_smoothing_equal_runs_trained_alone(tmp_path):
    """Learning rate, weight decay, warmup, dropout rate and label smoothing as per-run
    arrays of one vmapped program: each run's records and params equal the run trained alone
    (its plain step with Python numbers), a rate of 0 included."""
    steps = ["train.steps=6", "train.eval_every=6", "train.checkpoint_every=6"]
    stacked = [
        _with(*steps, *h, seed=i, workdir=tmp_path / "stacked" / str(i))
        for i, h in enumerate(HYPER_RUNS)
    ]
    alone = [
        _with(*steps, *h, seed=i, workdir=tmp_path / "alone" / str(i))
        for i, h in enumerate(HYPER_RUNS)
    ]
    assert sorted(varying(stacked)) == sorted(HYPERPARAMETERS)
    streams = [io.StringIO() for _ in stacked]
    assert train_stacked(stacked, streams=streams, plot=False) == {"step": 6, "stopped": False}
    for exp_s, exp_a in zip(stacked, alone, strict=True):
        _assert_equals_run_alone(exp_s, exp_a, 2 + 1)
    smoothed = [
        "smoothed_loss" in r for r in read_records(Path(stacked[0].workdir) / "metrics.jsonl")
    ]
    assert not any(smoothed)  # run 0's loss is its NLL, as alone


def _with(*overrides: str, seed: int = 0, workdir: Path | str = ""):
    args = [*TINY, *overrides, f"train.seed={seed}", f"train.workdir={workdir}"]
    return load(ROOT / "configs/reverse.toml", args)


def test_seeds_and_numeric_hyperparameters_may_differ_shapes_may_not(tmp_path):
    a, b = _experiments("configs/reverse.toml", tmp_path)
    assert stackable(a, b)
    numeric = [
        "optim.learning_rate=1e-2",
        "optim.weight_decay=0.1",
        "optim.warmup_steps=5",
        "optim.label_smoothing=0.1",
        "model.dropout_rate=0.0",
    ]
    assert stackable(a, _with(*numeric, seed=3))
    for shape in ("model.d_model=32", "model.num_layers=2", "model.position=rope"):
        assert not stackable(a, _with(shape))
    assert not stackable(a, _with("optim.schedule=linear"))  # a schedule's code, not a number
    c = _with("model.d_model=32", workdir=tmp_path / "c")
    with pytest.raises(ConfigError, match="differ only in train.seed and optim.learning_rate"):
        train_stacked([a, c])


def test_a_program_is_compiled_for_the_numbers_its_runs_share():
    """The numbers that do not vary in a group are constants of its program: a group sharing
    another learning rate gets another program, not the cached one."""
    from tfmjax.train.stacked import _vmapped_steps

    keys = ("model.dropout_rate",)
    program = _vmapped_steps(_with("optim.learning_rate=1e-3"), keys)
    assert _vmapped_steps(_with("optim.learning_rate=1e-3", seed=4), keys) is program
    assert _vmapped_steps(_with("optim.learning_rate=1e-2"), keys) is not program


def test_a_stopped_group_saves_every_run_and_resumes_to_the_same_records(tmp_path, monkeypatch):
    """A signal at step 5 (set on the shared StopSignals flag right after that step's call):
    every run saves step 5; the rerun resumes them and ends with the records and params of a
    group never stopped, bit for bit (the same program runs the same steps)."""
    import tfmjax.train.stacked as stacked_module
    from tfmjax.train.stopping import StopSignals

    straight = _experiments("configs/reverse.toml", tmp_path / "straight")
    train_stacked(straight, streams=[io.StringIO(), io.StringIO()], plot=False)
    stopped = _experiments("configs/reverse.toml", tmp_path / "stopped")
    at_step_end = stacked_module._at_step_end
    with StopSignals() as outer:

        def signalled_at_5(loops, state, first, done, t):
            state = at_step_end(loops, state, first, done, t)
            if done == 5:
                outer.requested = "SIGTERM"
            return state

        monkeypatch.setattr(stacked_module, "_at_step_end", signalled_at_5)
        result = train_stacked(stopped, streams=[io.StringIO(), io.StringIO()], plot=False)
    assert result == {"step": 5, "stopped": "SIGTERM"}
    for exp in stopped:
        saved = sorted(p.name for p in (Path(exp.workdir) / "checkpoints").iterdir())
        assert saved == ["5"]
    monkeypatch.setattr(stacked_module, "_at_step_end", at_step_end)
    again = train_stacked(stopped, streams=[io.StringIO(), io.StringIO()], plot=False)
    assert again == {"step": 12, "stopped": False}
    for exp_r, exp_s in zip(stopped, straight, strict=True):
        got = [deterministic_part(r) for r in read_records(Path(exp_r.workdir) / "metrics.jsonl")]
        want = [deterministic_part(r) for r in read_records(Path(exp_s.workdir) / "metrics.jsonl")]
        assert got == want
        _, params_r, _ = load_for_inference(exp_r.workdir)
        _, params_s, _ = load_for_inference(exp_s.workdir)
        for r, s in zip(jax.tree.leaves(params_r), jax.tree.leaves(params_s), strict=True):
            np.testing.assert_array_equal(np.asarray(r), np.asarray(s))
