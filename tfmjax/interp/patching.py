"""Activation patching (Meng et al. 2022; Wang et al. 2023) and attribution patching (Nanda
2023), swept over layers, positions and heads.

A sweep runs the model on a *target* batch (e.g. corrupted inputs) and, for each choice of
layer x position x head, puts the *source* run's activation (e.g. the clean cache) at that
hook point, then reads a scalar ``metric(logits, batch)``. Every choice is one row of a
boolean mask tensor, and the rows go through ``lax.map`` inside one jitted function: the
sweep compiles once, whatever the patch values (they are arguments, not constants).

Attribution patching replaces the sweep by one forward and one backward pass: the change of
the metric is approximated to first order, ``Σ (a_source − a_target) · ∂metric/∂a`` at the
target run, summed over what a patch would replace.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.interp.hooked import (
    ActivationCache,
    axes,
    hook_shapes,
    prepare,
    resolve,
    run_with_patches,
)
from tfmjax.losses import cross_entropy

PER = ("layer", "position", "head", "position_head")


# -- metrics: (logits [B,T,V], batch) -> scalar ----------------------------------------------


def logit_difference(correct, wrong, position):
    """Metric: mean over rows of ``logits[b, position_b, correct_b] - logits[.., wrong_b]``
    (each argument an int or ``[B]``)."""

    def metric(logits, batch):
        rows = jnp.arange(logits.shape[0])
        at = logits[rows, jnp.broadcast_to(jnp.asarray(position), rows.shape)]
        pick = lambda ids: jnp.take_along_axis(
            at, jnp.broadcast_to(jnp.asarray(ids), rows.shape)[:, None], axis=1
        )[:, 0]
        return jnp.mean(pick(correct) - pick(wrong))

    return metric


def teacher_forced_exact_match(model):
    """Metric: share of rows whose every target token (``model.targets_and_mask``) is the
    argmax. Equal to greedy exact-match: a greedy decode follows the same tokens."""

    def metric(logits, batch):
        targets, mask = model.targets_and_mask(batch)
        wrong = (jnp.argmax(logits, axis=-1) != targets) & (mask > 0)
        return jnp.mean(~jnp.any(wrong, axis=1))

    return metric


def answer_loss(model):
    """Metric: mean cross-entropy of the target tokens (nats per token)."""

    def metric(logits, batch):
        targets, mask = model.targets_and_mask(batch)
        nll, tokens = cross_entropy(logits, targets, mask)
        return nll / jnp.maximum(tokens, 1.0)

    return metric


# -- sweeps ------------------------------------------------------------------------------------


def layer_names(model, stack: str, hook: str, layers=None) -> list[str]:
    """``{stack}.blocks.{l}.{hook}`` for ``layers`` (default: every layer of the stack)."""
    count = model.layer_stacks()[stack]
    return [f"{stack}.blocks.{l}.{hook}" for l in (range(count) if layers is None else layers)]


def _choice_masks(names, shapes, per: str):
    """``(masks {name: [M, ...]}, grid shape)``: one row per layer x position x head choice;
    row ``m`` is True only at its own layer's chosen position/head."""
    if per not in PER:
        raise ValueError(f"per={per!r} is not one of {', '.join(PER)}")
    shape = shapes[names[0]]
    pos_axis, head_axis = axes(names[0])
    if per in ("head", "position_head") and head_axis is None:
        raise ValueError(f"{names[0]} has no head axis: sweep it per layer or position")
    if per in ("position", "position_head") and pos_axis is None:
        raise ValueError(f"{names[0]} has no position axis: sweep it per layer or head")
    grid = [len(names)]
    if per in ("position", "position_head"):
        grid.append(shape[pos_axis])
    if per in ("head", "position_head"):
        grid.append(shape[head_axis])
    mask_shape = [1] * len(shape)
    if per in ("position", "position_head"):
        mask_shape[pos_axis] = shape[pos_axis]
    if per in ("head", "position_head"):
        mask_shape[head_axis] = shape[head_axis]
    masks = {n: np.zeros([int(np.prod(grid)), *mask_shape], bool) for n in names}
    for m, choice in enumerate(itertools.product(*map(range, grid))):
        index = [m] + [0] * len(shape)
        rest = list(choice[1:])
        if per in ("position", "position_head"):
            index[1 + pos_axis] = rest.pop(0)
        if per in ("head", "position_head"):
            index[1 + head_axis] = rest.pop(0)
        masks[names[choice[0]]][tuple(index)] = True
    return {n: jnp.asarray(v) for n, v in masks.items()}, tuple(grid)


class PatchSweep:
    """Patch ``hook`` of each layer of ``stack`` from a source cache into a target run, per
    ``"layer"``, ``"position"``, ``"head"`` or ``"position_head"``; returns the metric on a
    grid ``[L]``, ``[L,T]``, ``[L,N]`` or ``[L,T,N]``.

    Build once and call with any params, target batch and source cache of the same shapes:
    the jitted function compiles once (``compilations`` counts its programs).
    """

    def __init__(self, model, hook: str, metric, *, per: str = "position", stack="decoder"):
        self.model, self.hook, self.metric, self.per, self.stack = model, hook, metric, per, stack
        self._run = jax.jit(self._sweep)

    @property
    def compilations(self) -> int:
        return self._run._cache_size()

    def __call__(self, params, batch, source: ActivationCache, layers=None):
        names = layer_names(self.model, self.stack, self.hook, layers)
        shapes = hook_shapes(self.model, params, batch)
        for name in names:
            resolve(name, shapes)  # a one-line KeyError for a name the model does not have
        masks, grid = _choice_masks(names, shapes, self.per)
        values = {n: source[n] for n in names}
        return self._run(params, batch, values, masks).reshape(grid)

    def _sweep(self, params, batch, values, masks):
        model, params = prepare(self.model, params)

        def one(row):
            edits = {
                n: (lambda x, n=n: jnp.where(row[n], values[n].astype(x.dtype), x)) for n in values
            }
            logits, _ = run_with_patches(model, params, batch, edits)
            return self.metric(logits, batch)

        return jax.lax.map(one, masks)


def patch_sweep(model, params, batch, source, hook, metric, *, per="position", stack="decoder"):
    """One :class:`PatchSweep` call (build the class to reuse its compiled program)."""
    return PatchSweep(model, hook, metric, per=per, stack=stack)(params, batch, source)


def _reduce(x, name: str, per: str):
    """Sum ``x`` over every axis but the ones ``per`` keeps (position, head)."""
    pos_axis, head_axis = axes(name)
    keep = {
        "layer": (),
        "position": (pos_axis,),
        "head": (head_axis,),
        "position_head": (pos_axis, head_axis),
    }[per]
    if None in keep:
        missing = "head" if per in ("head", "position_head") and head_axis is None else "position"
        raise ValueError(f"{name} has no {missing} axis: attribute it per layer or the other axis")
    summed = jnp.sum(x, axis=tuple(a for a in range(x.ndim) if a not in keep))
    return summed if per != "position_head" or pos_axis < head_axis else summed.T


def attribution_patch(
    model, params, batch, source: ActivationCache, hook, metric, *, per="position", stack="decoder"
):
    """First-order estimate of :func:`patch_sweep`'s grid minus the unpatched metric:
    ``Σ (source − target) · ∂metric/∂activation`` at the target run; ``[L]``, ``[L,T]``,
    ``[L,N]`` or ``[L,T,N]``. One forward and one backward pass, compiled."""
    names = tuple(layer_names(model, stack, hook))
    values = {n: source[n] for n in names}
    return _attribution(model, names, metric, per)(params, batch, values)


@functools.lru_cache(maxsize=16)
def _attribution(model, names: tuple, metric, per: str):
    def run(params, batch, source):
        zeros = {n: jnp.zeros_like(source[n], jnp.float32) for n in names}

        def metric_of(deltas):
            edits = {n: (lambda x, n=n: x + deltas[n].astype(x.dtype)) for n in names}
            logits, cache = run_with_patches(model, params, batch, edits, names=names)
            return metric(logits, batch), cache

        grads, target = jax.grad(metric_of, has_aux=True)(zeros)
        return jnp.stack([_reduce((source[n] - target[n]) * grads[n], n, per) for n in names])

    return jax.jit(run)
