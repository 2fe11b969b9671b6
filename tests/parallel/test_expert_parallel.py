"""Expert parallelism: a mixture-of-experts model trained on a ``data x expert`` mesh (2 and
4 of the suite's simulated CPU devices) equals training on one device, with each device
holding only its experts; a mesh that cannot split the experts is refused in one line."""

from __future__ import annotations

import functools

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


def test_experts_that_do_not_split_are_refused_in_one_line():
    exp = experiment(1, 3, ["model.moe_experts=4"])
    with pytest.raises(ConfigError, match=r"^mesh.expert=3 does not divide model.moe_experts=4"):
        Placement.for_run(exp, jax.devices()[:3])
