"""Run a model with its hook points on: record activations, replace or edit them.

``run_with_cache(model, params, batch)`` returns the logits of ``model.apply(params, batch)``
and an :class:`ActivationCache` of the hook points (:mod:`tfmjax.layers.hooks`);
``run_with_patches(model, params, batch, edits)`` applies ``{name: x -> x}`` edits on the way.
Both take any family's training batch and work under ``jax.jit`` (names and edit functions
are static: they shape the program).

The model is run with its layers unrolled (hooks know their layer from the module path) and
without remat; scanned params are unstacked first, so a checkpoint of any layout works.

Names are full (``decoder.blocks.0.attn.hook_q``), a dotted suffix that picks exactly
one hook point (``blocks.0.attn.hook_q`` in a decoder-only model), or, to record, a pattern
with ``*`` (``decoder.blocks.*.attn.hook_pattern``); :func:`hook_shapes` lists them.
Position ``t`` of a decoder activation is the decoder's input at ``t``: BOS at 0, then
``tokens[t-1]`` (the model shifts its targets right itself).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from collections.abc import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp

from tfmjax.interp.lens import TransformerLensHelpers
from tfmjax.interp.names import act_name, canonical
from tfmjax.layers.hooks import COLLECTION, hooks_active

Edits = Mapping[str, Callable]


def prepare(model, params):
    """``(model, params)`` to run with hooks: layers unrolled, no remat, dropout off."""
    cfg = dataclasses.replace(model.config, scan_layers=False, remat=False)
    _, params = model.unrolled(params)
    return type(model)(cfg, deterministic=True), params


@jax.tree_util.register_pytree_node_class
class ActivationCache(TransformerLensHelpers, Mapping):
    """Activations by full hook name, read as ``cache[name]`` (a suffix that picks one name
    is enough, for ``in`` too), or by TransformerLens's short names: ``cache["pattern", 0]``,
    ``cache["resid_pre", -1]``, ``cache["embed"]``, ``cache["scale4ln1"]``
    (:mod:`tfmjax.interp.names`). A read-only mapping over the full names, sorted (``keys``,
    ``items``, ``values``, ``len``, iteration, ``get``), and a pytree, so it can be returned
    from and passed into jitted functions. TransformerLens's helpers are its methods
    (:mod:`tfmjax.interp.lens`); they need the ``model`` and ``params`` it is bound to."""

    def __init__(self, activations: Mapping, model=None, params=None):
        self.activations = dict(activations)
        self.model, self.params = model, params

    def bind(self, model, params) -> ActivationCache:
        """This cache bound to the model (and params) it came from, for the helpers."""
        return type(self)(self.activations, model, params)

    def tree_flatten(self):
        names = sorted(self.activations)
        return [self.activations[n] for n in names], names

    @classmethod
    def tree_unflatten(cls, names, values):
        return cls(dict(zip(names, values, strict=True)))

    def names(self) -> list[str]:
        return sorted(self.activations)

    def __contains__(self, name) -> bool:
        try:
            self._full_name(name)
        except KeyError:
            return False
        return True

    def __getitem__(self, name):
        return self.activations[self._full_name(name)]

    def _full_name(self, key) -> str:
        """The full name of ``key``: a hook name or suffix, or TransformerLens's short form
        (a tuple ``(name, layer, layer type)`` or one string; a negative layer counts back),
        which reads the stack the output head reads when the cache is bound to its model."""
        if not isinstance(key, tuple):
            if key in self.activations or matching(canonical(key), self.activations):
                return resolve(canonical(key), self.activations)
            key = (key,)
        name, *rest = key
        if rest and rest[0] is not None and rest[0] < 0:
            rest[0] += self._layer_count()
        name = canonical(act_name(name, *rest))
        if self.model is not None and f"{self.model.head_stack}.{name}" in self.activations:
            return f"{self.model.head_stack}.{name}"
        return resolve(name, self.activations)

    def _layer_count(self) -> int:
        """Layers of the head's stack (the bound model's; else counted from the names)."""
        if self.model is not None:
            return self.model.layer_stacks()[self.model.head_stack]
        found = [re.search(r"blocks\.(\d+)\.", n) for n in self.activations]
        return 1 + max((int(m.group(1)) for m in found if m), default=-1)

    def __len__(self) -> int:
        return len(self.activations)

    def __iter__(self):
        return iter(self.names())

    def stack(self, name: str, stack: str = "decoder"):
        """``{stack}.blocks.{l}.{name}`` of every layer, stacked: ``[L, ...]``."""
        found = {}
        for full, x in self.activations.items():
            m = re.fullmatch(rf"{re.escape(stack)}\.blocks\.(\d+)\.{re.escape(name)}", full)
            if m:
                found[int(m.group(1))] = x
        if not found:
            raise KeyError(f"no {stack}.blocks.*.{name} in the cache; it has {self.names()}")
        return jnp.stack([found[i] for i in sorted(found)])


def matching(name: str, names: Iterable[str]) -> list[str]:
    """The full names equal to ``name`` or ending in ``.name``."""
    return [n for n in names if n == name or n.endswith("." + name)]


def resolve(name: str, names: Iterable[str]) -> str:
    """The one full name ``name`` picks out of ``names``; a one-line KeyError otherwise."""
    names = list(names)
    found = matching(name, names)
    if name in names:
        return name
    if len(found) == 1:
        return found[0]
    if not found:
        example = next(iter(sorted(names)), "decoder.blocks.0.attn.hook_q")
        raise KeyError(
            f"no hook point {name!r}; names look like {example!r} (tfmjax.interp.hook_shapes "
            "lists them)"
        )
    raise KeyError(f"hook name {name!r} is ambiguous: it matches {found}; give the full name")


def _apply(model, params, batch, capture, edits: Edits | None, every=False):
    with hooks_active(capture=capture, edits=edits, every=every):
        logits, state = model.apply(params, batch, mutable=[COLLECTION])
    return logits, ActivationCache(_flatten(state.get(COLLECTION, {})))


def _flatten(tree) -> dict:
    """Sown hook values (leaves keyed by full name at any depth) -> ``{name: array}``."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value))
        else:
            out[key] = value
    return out


@functools.lru_cache(maxsize=64)
def _hook_shapes(model, params_struct, batch_struct) -> dict:
    params = jax.tree.unflatten(params_struct[0], params_struct[1])
    batch = jax.tree.unflatten(batch_struct[0], batch_struct[1])
    _, cache = jax.eval_shape(lambda p, b: _apply(model, p, b, None, None, True), params, batch)
    return {n: tuple(x.shape) for n, x in cache.activations.items()}


def hook_shapes(model, params, batch, *, prepared: bool = False) -> dict[str, tuple]:
    """``{full hook name: shape}`` of every hook point for this batch (nothing is computed)."""
    if not prepared:
        model, params = prepare(model, params)
    struct = lambda tree: (
        jax.tree.structure(tree),
        tuple(
            jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(tree)
        ),
    )
    return dict(_hook_shapes(model, struct(params), struct(batch)))


def run_with_cache(model, params, batch, names: Iterable[str] | None = None):
    """``(logits, ActivationCache)``: the plain forward pass, with the hook points ``names``
    recorded (default: all but TransformerLens's split inputs, ``hook_attn_in`` and
    ``hook_q/k/v_input``, the residual repeated per head: name them, or ``["*"]``). The cache
    is bound to the ``model`` and ``params`` given, for its helpers."""
    prepared, unrolled = prepare(model, params)
    capture = None if names is None else _full_or_given(prepared, unrolled, batch, names)
    logits, cache = _cached_run(prepared, capture)(unrolled, batch)
    return logits, cache.bind(model, params)


@functools.lru_cache(maxsize=32)
def _cached_run(model, capture):
    """One jitted ``run_with_cache`` per (model, names): compiled once per batch shape."""
    return jax.jit(lambda params, batch: _apply(model, params, batch, capture, None))


def run_with_patches(model, params, batch, edits: Edits, names: Iterable[str] | None = ()) -> tuple:
    """``(logits, ActivationCache)`` with ``edits`` ``{name: x -> x}`` applied at their hook
    points (see :func:`replace`); the cache holds ``names`` (default none; None: as
    :func:`run_with_cache`), as edited."""
    prepared, unrolled = prepare(model, params)
    full = _full_or_given(prepared, unrolled, batch, edits)
    edits = dict(zip(full, edits.values(), strict=True))
    capture = None if names is None else _full_or_given(prepared, unrolled, batch, names)
    # Compiled as one program (edits close over their values, so each call compiles anew:
    # still faster than running a model op by op; sweeps use PatchSweep, which compiles once).
    run = jax.jit(lambda p, b: _apply(prepared, p, b, capture, edits))
    logits, cache = run(unrolled, batch)
    return logits, cache.bind(model, params)


def _full_or_given(model, params, batch, names: Iterable[str]) -> tuple[str, ...]:
    """Each name as its full name (checked against the model's hook points); a name with
    ``*`` is a pattern of full names or of their dotted suffixes
    (``decoder.blocks.*.attn.hook_pattern``, ``blocks.*.hook_q_input``): every match."""
    known = hook_shapes(model, params, batch, prepared=True)
    out = []
    for name in names:
        name = canonical(name)
        if "*" not in name:
            out.append(resolve(name, known))
            continue
        suffix = f"*.{name}"
        found = sorted(
            n for n in known if fnmatch.fnmatchcase(n, name) or fnmatch.fnmatchcase(n, suffix)
        )
        if not found:
            raise KeyError(f"no hook point matches {name!r} (tfmjax.interp.hook_shapes lists them)")
        out.extend(found)
    return tuple(out)


# -- edits ---------------------------------------------------------------------------------


def axes(name: str) -> tuple[int | None, int | None]:
    """``(position axis, head axis)`` of a hook point's activation (None: it has none)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in _HEAD_FIRST:  # [B,N,T,S]
        return 2, 1
    if leaf in _HEADS_AFTER_POSITION:  # [B,T,N,...]
        return 1, 2
    if leaf == "hook_state":  # retention's state [B,N,H,H]
        return None, 1
    if leaf == "hook_ssm_state":  # the selective scan's state [B,E,P]
        return None, None
    return 1, None


# Nyström's kernel_a and kernel_b have landmarks on axis 2, its landmark hooks on axis 1;
# Linformer's k_proj and v_proj [B,R,K,H] have their projected rows on axis 1 (as landmarks).
_HEAD_FIRST = frozenset(
    {"hook_pattern", "hook_attn_scores", "hook_decayed_scores"}
    | {"hook_kernel_f", "hook_kernel_a", "hook_kernel_b"}
)
_HEADS_AFTER_POSITION = frozenset(
    {"hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_z", "hook_result"}
    | {"hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input"}
    | {"hook_gate", "hook_landmarks_q", "hook_landmarks_k", "hook_k_proj", "hook_v_proj"}
)


def selection(name: str, shape: tuple, positions=None, heads=None):
    """Boolean mask broadcastable to ``shape``: True at ``positions`` (ints or a bool mask
    over the position axis) and ``heads`` of hook ``name`` (None: all of them)."""
    pos_axis, head_axis = axes(name)
    mask = jnp.ones([1] * len(shape), bool)
    for axis, chosen, what in ((pos_axis, positions, "position"), (head_axis, heads, "head")):
        if chosen is None:
            continue
        if axis is None:
            other = "by head" if what == "position" and head_axis is not None else "whole"
            other = "by position only" if what == "head" and pos_axis is not None else other
            raise ValueError(f"{name} has no {what} axis; patch it {other}")
        chosen = jnp.asarray(chosen)
        if chosen.dtype != bool:
            chosen = jnp.zeros(shape[axis], bool).at[chosen].set(True)
        mask = mask & chosen.reshape([shape[axis] if a == axis else 1 for a in range(len(shape))])
    return mask


def replace(value, name: str = "", positions=None, heads=None) -> Callable:
    """An edit that puts ``value`` (broadcastable to the activation) at ``positions`` and
    ``heads`` of hook ``name`` (both None: everywhere)."""
    if positions is None and heads is None:
        return lambda x: jnp.broadcast_to(jnp.asarray(value, x.dtype), x.shape)
    return lambda x: jnp.where(
        selection(name, x.shape, positions, heads), jnp.asarray(value, x.dtype), x
    )


def mean_ablate(mean, name: str, heads=None, positions=None) -> Callable:
    """Replace the chosen heads/positions by ``mean`` (e.g. the activation averaged over a
    reference batch and its positions, keepdims)."""
    return replace(mean, name, positions=positions, heads=heads)
