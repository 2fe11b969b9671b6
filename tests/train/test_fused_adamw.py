"""FusedAdamW against Optax's clip + AdamW (tfmjax.train.optimizer.make_optimizer), the
reference: the same operations in the same order, on flat buffers instead of leaves.

Tolerance: rtol 1e-6, atol 1e-9 (updates are ~1e-3). Two things round differently: where
clipping acts, the global norm sums its squares in another order; and XLA:CPU's loops round
some elementwise operations (the divisions) differently for a buffer of another length
(vectorised body or scalar tail), so even without clipping the update may differ in its last
few bits: measured up to 3 ulps (relative 2.3e-7). The state layout checkpoints hold is
Optax's own, exactly."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax.config import ModelConfig
from tfmjax.data import make_batch, make_task
from tfmjax.models import build
from tfmjax.train.fused_adamw import FusedAdamW, groups_of
from tfmjax.train.optimizer import make_optimizer
from tfmjax.train.state import create_state
from tfmjax.train.step import make_train_step

TASK = make_task("copy", num_symbols=5, max_len=5)


@functools.cache
def params_and_grads(steps=3):
    """A tiny decoder's params (matrices that decay, norms and embeddings that don't) with a
    bf16 leaf among them, and ``steps`` random gradient trees of norm around 1-10."""
    cfg = ModelConfig(
        family="decoder_only", vocab_size=16, d_model=16, num_heads=2, d_ff=32, num_layers=1
    )
    batch = make_batch(TASK, batch_size=2, seed=0, step=0, batch_format="prompt_answer")
    params = jax.jit(build(cfg).init)(jax.random.key(0), batch)
    leaves, treedef = jax.tree.flatten(params)
    leaves[0] = leaves[0].astype(jnp.bfloat16)  # a second dtype: its own group
    params = jax.tree.unflatten(treedef, leaves)
    keys = jax.random.split(jax.random.key(1), steps)
    grads = [
        jax.tree.map(lambda p, k=k: (jax.random.normal(k, p.shape) * 0.3).astype(p.dtype), params)
        for k in keys
    ]
    return params, grads


def run(tx, params, grads):
    state, update = tx.init(params), jax.jit(tx.update)
    updates = []
    for g in grads:
        u, state = update(g, state, params)
        params = optax.apply_updates(params, u)
        updates.append(u)
    return params, state, updates


SETTINGS = dict(b1=0.9, b2=0.98, eps=1e-9)


def close(a, b):
    np.testing.assert_allclose(
        np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6, atol=1e-9
    )


@pytest.mark.parametrize("schedule", [1e-3, optax.linear_schedule(1e-3, 1e-4, 3)])
def test_without_clipping_it_is_optax_to_a_few_ulps(schedule):
    params, grads = params_and_grads()
    kw = dict(schedule=schedule, weight_decay=0.1, clip_norm=None, **SETTINGS)
    fused = FusedAdamW(**kw)
    want_params, want_state, want_updates = run(make_optimizer(**kw), params, grads)
    got_params, got_state, got_updates = run(fused, params, grads)
    for want, got in zip(want_updates, got_updates, strict=True):
        jax.tree.map(close, want, got)
    jax.tree.map(close, want_params, got_params)
    # the saved layout is Optax's state itself, moments and counts included
    saved = fused.to_saved(got_state, got_params)
    assert jax.tree.structure(saved) == jax.tree.structure(want_state)
    jax.tree.map(close, want_state, saved)


def test_with_clipping_it_agrees_to_the_norms_rounding():
    params, grads = params_and_grads()
    assert float(optax.tree.norm(grads[0])) > 1.0  # the clip acts
    kw = dict(schedule=1e-3, weight_decay=0.1, clip_norm=1.0, **SETTINGS)
    want_params, _, want_updates = run(make_optimizer(**kw), params, grads)
    got_params, _, got_updates = run(FusedAdamW(**kw), params, grads)
    for want, got in zip(want_updates, got_updates, strict=True):
        jax.tree.map(close, want, got)
    jax.tree.map(close, want_params, got_params)


def test_saved_layout_round_trip_is_exact_and_groups_split_by_dtype_and_decay():
    params, grads = params_and_grads()
    fused = FusedAdamW(schedule=1e-3, weight_decay=0.1, clip_norm=1.0, **SETTINGS)
    _, state, _ = run(fused, params, grads)
    back = fused.from_saved(fused.to_saved(state, params), params)
    jax.tree.map(np.testing.assert_array_equal, state, back)
    groups = groups_of(params)
    assert sorted(i for m in groups.members for i in m) == list(range(len(jax.tree.leaves(params))))
    assert set(groups.decays) == {True, False}
    assert len(groups.members) == 3  # bf16 (an embedding, no decay), f32 decayed, f32 not
    assert [b.size for b in state.mu] == [
        sum(jax.tree.leaves(params)[i].size for i in m) for m in groups.members
    ]


def test_train_step_with_it_matches_the_optax_step():
    """The whole step (gradients, the grad_norm metric, the non-finite guard) with either
    optimizer, one step, the clip acting. One step: in Adam's first steps an ulp's
    difference in a near-zero gradient can flip its update's sign (the update is about
    lr * sign(g)), so a longer trajectory is no test of the optimizer."""
    cfg = ModelConfig(
        family="decoder_only", vocab_size=16, d_model=16, num_heads=2, d_ff=32, num_layers=1
    )
    batch = make_batch(TASK, batch_size=4, seed=0, step=0, batch_format="prompt_answer")
    out = {}
    for name, make in (("optax", make_optimizer), ("fused", FusedAdamW)):
        tx = make(schedule=3e-3, weight_decay=0.1, clip_norm=0.5, **SETTINGS)
        state = create_state(build(cfg), tx, batch, seed=0)
        step = jax.jit(make_train_step(build(cfg, deterministic=False), tx, lambda s: 3e-3))
        state, metrics = step(state, batch)
        out[name] = (state.params, metrics)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9),
        out["optax"],
        out["fused"],
    )
    assert float(out["fused"][1]["grad_norm"]) > 0.5  # the clip acted
