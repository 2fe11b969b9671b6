"""Expert parallelism: a mixture-of-experts model trained on a ``data x expert`` mesh (2 and
4 of the suite's simulated CPU devices) equals training on one device, with each device
holding only its experts; ``train.py`` runs in a process of exactly 2 devices; a mesh that
cannot split the experts is refused in one line."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from tfmjax.config import ConfigError, load
from tfmjax.parallel import Placement
from tfmjax.train.run import build_run
from tfmjax.train.state import create_state

STEPS = 3
SMALL = [
    "model.d_model=32",
    "model.num_heads=4",
    "model.d_ff=32",
    "model.num_layers=2",
    "model.max_len=32",
    "model.moe_experts=4",
    "model.moe_top_k=2",
    "model.moe_every=2",
    "model.moe_capacity_factor=1.0",
    "data.batch_size=8",
    "data.eval_examples=8",
    "optim.warmup_steps=1",
    "train.steps=10",
]

pytestmark = pytest.mark.xdist_group("mesh")


def experiment(data: int, expert: int, extra=()):
    mesh = [f"mesh.data={data}", f"mesh.expert={expert}"]
    return load("configs/reverse_decoder.toml", [*SMALL, *mesh, *extra])


@functools.cache
def train(data: int, expert: int):
    """``(run, final state, losses)`` of ``STEPS`` steps on a data x expert mesh."""
    run = build_run(experiment(data, expert))
    state = create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings)
    records = []
    for step in range(STEPS):
        state, metrics = run.train_step(state, run.device_batch(step))
        records.append(float(metrics["loss"]))
    return run, state, records


def _flat(tree):
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


@pytest.mark.parametrize("mesh", [(1, 2), (2, 2)], ids=["expert2", "data2xexpert2"])
def test_expert_parallel_training_equals_one_device(mesh):
    _, want_state, want_losses = train(1, 1)
    run, state, losses = train(*mesh)
    assert dict(run.placement.mesh.shape)["expert"] == 2
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    got, want = _flat(state.params), _flat(jax.device_get(want_state.params))
    experts = 0
    for path, array in got.items():
        # Softmax ignores a bias shared by every key: its gradient is rounding, which Adam
        # scales up to steps of about the learning rate (as in test_mesh.py).
        lr = run.experiment.optim.learning_rate
        tol = dict(atol=STEPS * lr) if path.endswith("key/bias") else dict(rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(array), want[path], **tol, err_msg=path)
        shards = {tuple(s.data.shape) for s in array.addressable_shards}
        if path.split("/")[-1] in ("up", "down", "up_bias", "down_bias"):  # [L/2, E, ...]
            assert shards == {(array.shape[0], 2, *array.shape[2:])}, path  # 2 of 4 experts
            experts += 1
        elif "router" in path:
            assert shards == {array.shape}, path  # the router is whole on every device
    assert experts == 4
    # the batch is split over data x expert
    assert run.placement.batch.spec[0] == ("data", "fsdp", "expert")
    if mesh == (1, 2):  # tokens travel to their experts' devices (GShard's all-to-all)
        compiled = run.train_step.lower(state, run.device_batch(0)).compile().as_text()
        assert " all-to-all(" in compiled


def test_experts_that_do_not_split_are_refused_in_one_line():
    exp = experiment(1, 3, ["model.moe_experts=4"])
    with pytest.raises(ConfigError, match=r"^mesh.expert=3 does not divide model.moe_experts=4"):
        Placement.for_run(exp, jax.devices()[:3])


def test_train_py_on_two_devices_with_the_experts_split(tmp_path):
    """``train.py`` in a process that has exactly 2 CPU devices (XLA_FLAGS), on
    ``mesh.expert=2``: it names the mesh, trains, evaluates, and logs the router metrics."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    overrides = [o for o in SMALL if not o.startswith("train.steps")]
    args = ["mesh.expert=2", "train.steps=4", "train.log_every=2", "train.eval_every=4"]
    args += ["train.checkpoint_every=4", f"train.workdir={tmp_path}"]
    done = subprocess.run(
        [sys.executable, "train.py", "configs/reverse_decoder.toml", *overrides, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mesh data=1 x fsdp=1 x expert=2 x tensor=1: 2 of 2 cpu devices" in done.stdout
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4]
    assert all(0 < r["moe_aux_loss"] <= 4 and 0 <= r["moe_dropped_fraction"] <= 1 for r in train)
