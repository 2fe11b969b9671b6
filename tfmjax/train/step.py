"""Pure train and eval steps: ``train_step(state, batch) -> (state, metrics)``.

Batches (NumPy or JAX, fixed shapes) are in the model family's ``batch_format``; the model
says which ids its logits predict and how much each counts (``model.targets_and_mask``:
every non-padding target for encoder-decoder, the answer only for decoder-only).

A mixture-of-experts model (``model.aux_metric_names``) adds its weighted auxiliary losses
per token to the objective (``model.apply_with_aux``), and the token-weighted sums of its
router metrics to the log window (``moe_*_sum``; the means land in ``metrics.jsonl``).

One step = one optimizer update on the whole batch. ``grad_accum_steps = k`` splits the
batch into k micro-batches of B/k rows, scanned, to save activation memory; the gradient
is the token-weighted mean over the whole batch either way (sums first, one division).

:func:`make_train_steps` runs the steps of batches stacked ``[n, B, ...]`` in one loop
(``train.steps_per_call``): step ``s`` is the same function of ``(state, batch s)`` whatever
the call (its dropout key is ``fold_in(root, state.step)``), and every n compiles the same
loop body, so n calls of one step and one call of n steps give the same bits (tested for
both families with dropout). The standalone ``train_step`` may differ from them in the last
bit: XLA compiles it into other kernels.

A step whose loss or gradient norm is not finite keeps ``params`` and ``opt_state``
unchanged (``jnp.where``), counts itself in ``window["nonfinite"]`` and records its
index in ``window["first_nonfinite"]``; the loop reads the window and stops. So a bad
update never reaches the state, let alone a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from tfmjax.train.loss_sums import batch_sums, chunked_batch_sums
from tfmjax.train.state import AUX_PREFIX, TrainState, sum_keys


def _microbatches(batch: dict, k: int) -> dict:
    """``[B, ...] -> [k, B/k, ...]`` for every array of the batch."""
    return {name: jnp.reshape(x, (k, x.shape[0] // k) + x.shape[1:]) for name, x in batch.items()}


def make_train_step(
    model,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    label_smoothing: float = 0.0,
    grad_accum_steps: int = 1,
    loss_chunk: int = 0,
) -> Callable:
    """The pure step for ``model`` (built with ``deterministic=False`` for dropout).

    ``schedule`` only reports the learning rate; ``tx`` must already contain it.
    ``loss_chunk`` > 0: the loss projects that many positions at a time
    (:func:`~tfmjax.train.loss_sums.chunked_batch_sums`; ``train.loss_chunk``).
    Returns ``train_step(state, batch) -> (state, metrics)``, not jitted
    (see :func:`jit_train_step`).
    """

    def grad_sums(params, batch, rng):
        def loss_fn(p):
            targets, mask = model.targets_and_mask(batch)
            if loss_chunk:
                h, penalty, aux = model.head_inputs_with_aux(p, batch, rngs={"dropout": rng})
                project = lambda x: model.project_head_inputs(p, x)  # noqa: E731
                with jax.named_scope("loss"):  # op_names for bench/profile_step.py
                    sums = chunked_batch_sums(
                        h, project, targets, mask, label_smoothing, loss_chunk
                    )
            else:
                logits, penalty, aux = model.apply_with_aux(p, batch, rngs={"dropout": rng})
                with jax.named_scope("loss"):
                    sums = batch_sums(logits, targets, mask, label_smoothing)
            sums.update({f"{name}_sum": value * sums["tokens"] for name, value in aux.items()})
            if not aux:  # a dense model: the objective is the loss alone
                return sums["loss_sum"], sums
            return sums["loss_sum"] + penalty * sums["tokens"], sums

        grads, sums = jax.grad(loss_fn, has_aux=True)(params)
        return grads, sums

    def accumulate(params, batch, rng):
        if grad_accum_steps == 1:
            return grad_sums(params, batch, rng)

        def body(carry, xs):
            index, micro = xs
            grads, sums = grad_sums(params, micro, jax.random.fold_in(rng, index))
            return jax.tree.map(jnp.add, carry, (grads, sums)), None

        zeros = (
            jax.tree.map(jnp.zeros_like, params),
            {k: jnp.zeros((), jnp.float32) for k in sum_keys(model)},
        )
        xs = (jnp.arange(grad_accum_steps), _microbatches(batch, grad_accum_steps))
        return jax.lax.scan(body, zeros, xs)[0]

    def train_step(state: TrainState, batch: dict):
        rng = jax.random.fold_in(state.root_key, state.step)
        grad_sum, sums = accumulate(state.params, batch, rng)
        grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grad_sum)
        with jax.named_scope("optimizer"):
            grad_norm = getattr(tx, "global_norm", optax.tree.norm)(grads)  # the clip's sum
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        ok = jnp.isfinite(sums["loss_sum"]) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        lr = jnp.asarray(schedule(state.step), jnp.float32)
        new_state = state.replace(
            step=state.step + 1,
            params=jax.tree.map(keep, params, state.params),
            opt_state=jax.tree.map(keep, opt_state, state.opt_state),
            window=_update_window(state.window, sums, grad_norm, lr, ok, state.step),
        )
        return new_state, step_metrics(sums, grad_norm, lr, ok)

    return train_step


def _update_window(window: dict, sums: dict, grad_norm, lr, ok, step) -> dict:
    """Add one step to the log window; a non-finite step adds only to the non-finite count."""
    new = dict(window)
    for key in sums:
        new[key] = window[key] + jnp.where(ok, sums[key], 0.0)
    new["grad_norm_sum"] = window["grad_norm_sum"] + jnp.where(ok, grad_norm, 0.0)
    new["steps"] = window["steps"] + jnp.where(ok, 1.0, 0.0)
    new["nonfinite"] = window["nonfinite"] + jnp.where(ok, 0.0, 1.0)
    first = window["first_nonfinite"]
    new["first_nonfinite"] = jnp.where((first < 0) & ~ok, step, first).astype(jnp.int32)
    new["learning_rate"] = lr
    return new


def step_metrics(sums: dict, grad_norm, lr, ok) -> dict:
    """Means of one step (device scalars; the loop logs the window instead)."""
    tokens = jnp.maximum(sums["tokens"], 1.0)
    return {
        "loss": sums["nll_sum"] / tokens,
        "token_accuracy": sums["correct"] / tokens,
        "exact_match": sums["exact"] / jnp.maximum(sums["sequences"], 1.0),
        "grad_norm": grad_norm,
        "learning_rate": lr,
        "finite": ok,
    }


def make_train_steps(train_step: Callable) -> Callable:
    """``train_steps(state, batches) -> (state, metrics)``: ``train_step`` on each of the
    batches stacked ``[n, B, ...]``, in order, in one loop; metrics stacked ``[n]``. Not
    jitted (see :func:`jit_train_steps`).

    Every n compiles the same loop body, so a call of one step and a call of ten give the same
    bits. (XLA:CPU contracts multiply-adds into FMAs kernel by kernel, so the same arithmetic
    compiled into other kernels can round differently in the last bit: a one-step call
    inlined by XLA, or sliced over a dimension of 1, did.) Two things keep XLA from compiling
    a call of one step differently: one ``lax.rng_uniform`` per step, XLA's stateful RNG, a
    side effect that keeps its simplifier from inlining a one-iteration loop (its value always
    passes ``< 2``, so ``finite`` is unchanged); and one spare slot in the stacked batches and
    metrics, so no slice or update is over a dimension of 1, which XLA would drop. The trip
    count stays static: a GPU runs the loop without reading a predicate back each step.
    """

    def train_steps(state: TrainState, batches: dict):
        n = jax.tree.leaves(batches)[0].shape[0]
        shapes = jax.eval_shape(train_step, state, jax.tree.map(lambda x: x[0], batches))[1]
        slots = jax.tree.map(lambda x: jnp.concatenate([x, x[:1]]), batches)  # n + 1
        metrics = jax.tree.map(lambda m: jnp.zeros((n + 1, *m.shape), m.dtype), shapes)

        def body(i, carry):
            state, metrics = carry
            batch = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, 0, False), slots)
            state, step = train_step(state, batch)
            kept = jax.lax.rng_uniform(0.0, 1.0, ()) < 2.0  # always true
            step = dict(step, finite=step["finite"] & kept)
            put = lambda buf, v: jax.lax.dynamic_update_index_in_dim(buf, v, i, 0)  # noqa: E731
            return state, jax.tree.map(put, metrics, step)

        state, metrics = jax.lax.fori_loop(0, n, body, (state, metrics))
        return state, jax.tree.map(lambda m: m[:n], metrics)

    return train_steps


def stacked_batch_sharding(placement):
    """The sharding of a stacked batch ``[n, B, ...]``: rows (dim 1) split over the batch
    axes as :attr:`Placement.batch` splits a batch's dim 0, the steps (dim 0) whole."""
    return NamedSharding(placement.mesh, PartitionSpec(None, *placement.batch.spec))


def jit_train_steps(train_step: Callable, placement=None, state_shardings=None) -> Callable:
    """:func:`make_train_steps` of ``train_step``, jitted like :func:`jit_train_step` (state
    donated; on a mesh the batches come as :func:`stacked_batch_sharding` says). One compile
    per number of steps ``n``."""
    train_steps = make_train_steps(train_step)
    if placement is None:
        return jax.jit(train_steps, donate_argnums=0)
    return placement.jit(
        train_steps,
        in_shardings=(state_shardings, stacked_batch_sharding(placement)),
        out_shardings=(state_shardings, placement.replicated),
        donate_argnums=0,
    )


def jit_train_step(train_step: Callable, placement=None, state_shardings=None) -> Callable:
    """``jax.jit`` with the state donated: its buffers are reused for the new state.

    With a :class:`~tfmjax.parallel.Placement` and the state's shardings, the step is
    compiled for the mesh: the state keeps its shardings, the batch comes split over the
    batch axes, the metrics are replicated.
    """
    if placement is None:
        return jax.jit(train_step, donate_argnums=0)
    return placement.jit(
        train_step,
        in_shardings=(state_shardings, placement.batch),
        out_shardings=(state_shardings, placement.replicated),
        donate_argnums=0,
    )


def make_eval_step(model) -> Callable:
    """Jitted ``eval_step(params, batch) -> sums`` (teacher forcing, no dropout, no smoothing)."""

    def eval_step(params, batch):
        logits = model.apply(params, batch)
        targets, mask = model.targets_and_mask(batch)
        return batch_sums(logits, targets, mask, 0.0)

    return jax.jit(eval_step)


def window_means(window: dict) -> dict:
    """Host floats of a fetched log window: mean loss, perplexity, accuracies, grad norm, lr."""
    import math

    tokens, seqs, steps = (max(float(window[k]), 1.0) for k in ("tokens", "sequences", "steps"))
    nll = float(window["nll_sum"]) / tokens
    means = {
        "loss": nll,
        "perplexity": math.exp(min(nll, 80.0)),
        "token_accuracy": float(window["correct"]) / tokens,
        "exact_match": float(window["exact"]) / seqs,
        "grad_norm": float(window["grad_norm_sum"]) / steps,
        "learning_rate": float(window["learning_rate"]),
    }
    if float(window["loss_sum"]) != float(window["nll_sum"]):
        means["smoothed_loss"] = float(window["loss_sum"]) / tokens
    for key in sorted(k for k in window if k.startswith(AUX_PREFIX)):  # mixture-of-experts
        means[key.removesuffix("_sum")] = float(window[key]) / tokens
    return means
