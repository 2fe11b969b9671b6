"""Global-norm clipping and AdamW as a few large operations on flat buffers.

:func:`tfmjax.train.optimizer.make_optimizer` (Optax's ``clip_by_global_norm`` then
``adamw``) updates every parameter leaf on its own: XLA compiles a handful of small kernels
per leaf. :class:`FusedAdamW` does the same arithmetic on one flat buffer per group of leaves
(same dtype, same weight-decay choice): the moments are kept flat, the gradients are
concatenated once, and clipping, both moments and the bias corrections are one elementwise
pass per group; the decay and the learning rate are applied per leaf, where the update meets
its parameter (one kernel with the step's apply), so the params are never copied flat. The
train step of ``configs/reverse.toml`` compiles 787 kernels instead of 1,109, 1.2x faster
(``bench/compile.py``).

The arithmetic is Optax's, operation for operation. Two things round differently: the
global norm sums the squares in another order (one reduction over each flat buffer instead
of one per leaf), and XLA:CPU rounds some elementwise operations (the divisions) differently
in a loop over a buffer of another length, so an update may differ from Optax's in its last
few bits (measured: up to 3 ulps, relative 2.3e-7; tests/train/test_fused_adamw.py).

Checkpoints keep Optax's layout (``FusedAdamW.to_saved`` and ``from_saved``
convert, exactly: the flat moments are the leaves' moments end to end), so a checkpoint
written by either optimizer resumes with the other; the train loop uses this one on a
single device, where the flat buffers need no sharding, and Optax's on a mesh, where every
moment is sharded like its parameter.

Shapes: ``N_g`` is the total size of group ``g``'s leaves; ``mu``, ``nu``: ``[N_g]`` each.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from tfmjax.train.optimizer import make_optimizer, weight_decay_mask


class FusedAdamWState(NamedTuple):
    """``count``: int32 ``[]`` (updates applied); ``mu``, ``nu``: one ``[N_g]`` per group."""

    count: jax.Array
    mu: tuple
    nu: tuple


class Groups(NamedTuple):
    """How leaves (in ``jax.tree.leaves`` order) are grouped: ``members[g]`` lists the leaf
    indices of group ``g`` in order, ``decays[g]`` says whether the group gets weight decay."""

    members: tuple[tuple[int, ...], ...]
    decays: tuple[bool, ...]


def groups_of(params: Any) -> Groups:
    """Leaves grouped by (dtype, weight decay), groups in order of their first leaf."""
    leaves = jax.tree.leaves(params)
    decays = jax.tree.leaves(weight_decay_mask(params))
    keys: dict[tuple, list[int]] = {}
    for i, (leaf, decay) in enumerate(zip(leaves, decays, strict=True)):
        keys.setdefault((jnp.dtype(leaf.dtype).name, bool(decay)), []).append(i)
    return Groups(tuple(tuple(m) for m in keys.values()), tuple(k[1] for k in keys))


def flatten_groups(tree: Any, groups: Groups) -> tuple[jax.Array, ...]:
    """A tree like the params -> one ``[N_g]`` buffer per group (leaves raveled, end to end)."""
    leaves = jax.tree.leaves(tree)
    return tuple(jnp.concatenate([leaves[i].reshape(-1) for i in m]) for m in groups.members)


def unflatten_groups(flat: tuple, like: Any, groups: Groups) -> Any:
    """Inverse of :func:`flatten_groups`: the buffers cut back into a tree shaped ``like``."""
    leaves, treedef = jax.tree.flatten(like)
    out: list = [None] * len(leaves)
    for buffer, members in zip(flat, groups.members, strict=True):
        offset = 0
        for i in members:
            size = leaves[i].size
            out[i] = buffer[offset : offset + size].reshape(leaves[i].shape)
            offset += size
    return jax.tree.unflatten(treedef, out)


class FusedAdamW:
    """Clipping (if ``clip_norm``) then AdamW, as :func:`make_optimizer` with the same
    arguments (an ``optax.GradientTransformation``: ``init``, ``update``); ``saved`` is that
    Optax optimizer, whose state layout checkpoints hold."""

    def __init__(self, **settings):
        """``settings``: :func:`make_optimizer`'s keywords (``schedule``, ``weight_decay``,
        ``b1``, ``b2``, ``eps``, ``clip_norm``), its defaults for those not given."""
        self.saved = make_optimizer(**settings)  # checks every setting, one line each
        bound = inspect.signature(make_optimizer).bind(**settings)
        bound.apply_defaults()
        s = bound.arguments
        self.schedule, self.weight_decay = s["schedule"], s["weight_decay"]
        self.b1, self.b2, self.eps, self.clip_norm = s["b1"], s["b2"], s["eps"], s["clip_norm"]
        # jitted once per optimizer (slices and concatenations, no arithmetic)
        self.to_saved = jax.jit(self._to_saved)
        self.from_saved = jax.jit(self._from_saved)

    def init(self, params: Any) -> FusedAdamWState:
        zeros = tuple(jnp.zeros_like(g) for g in flatten_groups(params, groups_of(params)))
        return FusedAdamWState(jnp.zeros([], jnp.int32), zeros, zeros)

    @staticmethod
    def global_norm(grads: Any) -> jax.Array:
        """The L2 norm of all of ``grads``, summed group by group as :meth:`update` does (so
        that XLA computes it once for both)."""
        return _norm(flatten_groups(grads, groups_of(grads)))

    def update(self, grads: Any, state: FusedAdamWState, params: Any = None):
        """``(updates like params, new state)``; Optax's ``clip_by_global_norm`` + ``adamw``
        arithmetic, one pass per group."""
        groups = groups_of(params)
        flat_grads = flatten_groups(grads, groups)
        if self.clip_norm is not None:
            norm = _norm(flat_grads)
            keep = norm < self.clip_norm  # optax: scale only above the threshold
            flat_grads = tuple(
                jax.lax.select(keep, g, (g / norm.astype(g.dtype)) * self.clip_norm)
                for g in flat_grads
            )
        count = optax.safe_increment(state.count)
        lr = self.schedule(state.count) if callable(self.schedule) else self.schedule
        directions, mus, nus = [], [], []
        for g, mu, nu in zip(flat_grads, state.mu, state.nu, strict=True):
            mu = (1 - self.b1) * g + self.b1 * mu
            nu = (1 - self.b2) * jnp.square(g) + self.b2 * nu
            mu_hat = mu / (1 - self.b1**count).astype(mu.dtype)
            nu_hat = nu / (1 - self.b2**count).astype(nu.dtype)
            directions.append(mu_hat / (jnp.sqrt(nu_hat) + self.eps))
            mus.append(mu)
            nus.append(nu)
        # The decay and the learning rate per leaf, where the update meets its parameter
        # (one kernel with the slice and the step's apply): the params are never copied flat.
        leaves, treedef = jax.tree.flatten(params)
        directions = jax.tree.leaves(unflatten_groups(tuple(directions), params, groups))
        updates = []
        for u, p, decays in zip(directions, leaves, _leaf_decays(groups, len(leaves)), strict=True):
            if decays and not _is_zero(self.weight_decay):  # optax skips a constant 0
                u = u + self.weight_decay * p
            updates.append(jnp.asarray(-lr, dtype=u.dtype) * u)
        new_state = FusedAdamWState(count, tuple(mus), tuple(nus))
        return jax.tree.unflatten(treedef, updates), new_state

    def _to_saved(self, state: FusedAdamWState, params: Any) -> Any:
        """The same state in the layout of :attr:`saved` (what checkpoints hold)."""
        groups = groups_of(params)
        mu = unflatten_groups(state.mu, params, groups)
        nu = unflatten_groups(state.nu, params, groups)

        def fill(node):
            if isinstance(node, optax.ScaleByAdamState):
                return node._replace(count=state.count, mu=mu, nu=nu)
            if isinstance(node, optax.ScaleByScheduleState):
                return node._replace(count=state.count)
            return node

        return _map_states(fill, self.saved.init(params))

    def _from_saved(self, saved: Any, params: Any) -> FusedAdamWState:
        """Inverse of :meth:`_to_saved`: a state of :attr:`saved`'s layout as this one's."""
        found = []
        _map_states(lambda n: found.append(n) or n, saved)
        (adam,) = [n for n in found if isinstance(n, optax.ScaleByAdamState)]
        groups = groups_of(params)
        return FusedAdamWState(
            adam.count, flatten_groups(adam.mu, groups), flatten_groups(adam.nu, groups)
        )


def _norm(flat: tuple) -> jax.Array:
    """The L2 norm of the flat buffers, summed buffer by buffer."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in flat))


def _leaf_decays(groups: Groups, n: int) -> list[bool]:
    """Whether each of the ``n`` leaves decays, in leaf order (from its group)."""
    out = [False] * n
    for members, decays in zip(groups.members, groups.decays, strict=True):
        for i in members:
            out[i] = decays
    return out


def _is_zero(value) -> bool:
    return isinstance(value, (int, float)) and value == 0.0


def _map_states(fn, node):
    """``fn`` applied to every Optax state inside ``node`` (tuples of named-tuple states,
    nested, e.g. ``MaskedState(inner_state=...)``); Adam's moments are not looked into."""
    if isinstance(node, optax.ScaleByAdamState):
        return fn(node)
    if isinstance(node, tuple):
        items = [_map_states(fn, n) for n in node]
        return fn(node._make(items)) if hasattr(node, "_fields") else tuple(items)
    return node
