"""Every experiment in configs/ loads, builds, and trains one step (shrunk by overrides)."""

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from tfmjax.config import load
from tfmjax.data import TASK_NAMES
from tfmjax.train.run import build_run
from tfmjax.train.state import abstract_state, create_state

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))
TINY = [
    "model.d_model=16",
    "model.num_heads=2",
    "model.d_ff=32",
    "model.num_layers=1",
    "data.batch_size=4",
    "data.eval_examples=4",
    "train.steps=100",
    "optim.warmup_steps=1",
]


TEXT_FAMILIES = {  # the text configs: language models and a masked LM
    "shakespeare_char": "decoder_only",
    "shakespeare_bpe": "decoder_only",
    "shakespeare_mlm": "encoder_only",
    "digits_vit": "encoder_only",  # images as sequences (model.input = "patches")
}


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    """A config naming its own task file (configs/parity.toml) gives its path from here."""
    monkeypatch.chdir(CONFIGS[0].parents[1])


def family_of(stem: str) -> str:
    if stem in TEXT_FAMILIES:
        return TEXT_FAMILIES[stem]
    return "decoder_only" if stem.endswith("_decoder") else "encoder_decoder"


def test_every_task_has_both_families():
    names = {p.stem for p in CONFIGS}
    for task in TASK_NAMES:
        assert task in names and f"{task}_decoder" in names, task


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_builds_and_traces_a_step(path):
    """Fast: the full config is valid; the shrunk one builds and its step traces (no compile)."""
    assert "# measured:" in path.read_text(), f"{path.name}: state the measured accuracy and time"
    full = load(path)
    assert full.model.family == family_of(path.stem)
    run = build_run(full)  # checks vocab, batch split, schedule, eval batches
    state = abstract_state(run.model, run.tx, run.batch(0), full.train.seed)
    out_state, metrics = jax.eval_shape(run.train_step, state, run.batch(0))
    assert out_state.step.shape == () and metrics["loss"].shape == ()


def _one_per_program(paths):
    """The first config of each distinct shrunk step program: configs of
    built-in tasks that differ only in the task, the vocabulary size and the optimizer's
    numbers compile the same layers, optimizer and loss (every config's own step is traced
    by the test above); text and a task file's own task each keep theirs."""
    seen, kept = set(), []
    for path in paths:
        experiment = load(path, TINY)
        model = {**dataclasses.asdict(experiment.model), "vocab_size": None}
        task = experiment.data.task
        o = experiment.optim  # its code paths, not its numbers
        optim = (o.schedule, o.weight_decay > 0, o.label_smoothing > 0, o.grad_accum_steps)
        key = repr((model, optim, "built-in" if task in TASK_NAMES else task))
        if key not in seen:
            seen.add(key)
            kept.append(path)
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("path", _one_per_program(CONFIGS), ids=lambda p: p.stem)
def test_config_trains_one_step(path):
    experiment = load(path, TINY)
    run = build_run(experiment)
    batch = run.batch(0)
    state = create_state(run.model, run.tx, batch, experiment.train.seed)
    state, metrics = run.train_step(state, batch)
    assert int(state.step) == 1
    assert np.isfinite(float(metrics["loss"]))
    assert bool(metrics["finite"])
