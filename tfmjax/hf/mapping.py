"""Tensor maps between Hugging Face state dicts and tfmjax params, both directions.

A :class:`Rule` ties one or more HF tensors to one or more tfmjax leaves with a pair of
exact, inverse transforms (transpose, reshape into heads, split/concatenate), so
``export(import(t)) == t`` byte for byte. A :class:`Mapping` holds the rules of the whole
model: ``top`` rules, and per layer stack the rules of one layer (``{i}`` in HF names).
tfmjax paths are ``/``-joined keys under ``params["params"]``; layer rules are relative to
one layer (``decoder/layers/...`` with a leading ``[L]`` axis when scanned, else
``decoder/layer_{i}/...``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import jax
import numpy as np

from tfmjax.hf.errors import HFError


@dataclasses.dataclass(frozen=True)
class Rule:
    """``to_ours(hf_arrays, our_shapes) -> our arrays``; ``to_hf(our_arrays) -> hf arrays``."""

    hf: tuple[str, ...]
    ours: tuple[str, ...]
    to_ours: Callable
    to_hf: Callable


@dataclasses.dataclass(frozen=True)
class Mapping:
    top: tuple[Rule, ...]
    stacks: tuple[tuple[str, int, tuple[Rule, ...]], ...]  # (our stack path, layers, rules)
    ignored: str = r"$^"  # regex of HF tensors that are buffers, not parameters


def same(hf: str, ours: str) -> Rule:
    """A tensor stored the same way on both sides (norm scales, embeddings)."""
    return Rule((hf,), (ours,), lambda a, s: [a[0].reshape(s[0])], lambda a: [a[0]])


def linear(hf: str, ours: str, in_dims: int = 1) -> Rule:
    """torch ``Linear.weight [out, in]`` <-> kernel ``[*in, *out]`` (``in_dims`` input axes)."""
    return Rule(
        (hf,),
        (ours,),
        lambda a, s: [a[0].T.reshape(s[0])],
        lambda a: [a[0].reshape(math.prod(a[0].shape[:in_dims]), -1).T],
    )


def flat(hf: str, ours: str, in_dims: int = 0) -> Rule:
    """``[in, out]`` (GPT-2 ``Conv1D``) or a bias ``[out]`` <-> ``[*in, *out]`` unflattened."""
    return Rule(
        (hf,),
        (ours,),
        lambda a, s: [a[0].reshape(s[0])],
        lambda a: [a[0].reshape(math.prod(a[0].shape[:in_dims]), -1) if in_dims else a[0].ravel()],
    )


def fused(hf: str, ours: tuple[str, ...], in_dims: int = 0) -> Rule:
    """One HF tensor holding several of ours side by side on its last axis (GPT-2 ``c_attn``)."""

    def to_ours(a, shapes):
        sizes = [math.prod(s[in_dims:]) for s in shapes]
        parts = np.split(a[0], np.cumsum(sizes)[:-1], axis=-1)
        return [p.reshape(s) for p, s in zip(parts, shapes, strict=True)]

    def to_hf(arrays):
        lead = arrays[0].shape[:in_dims]
        return [np.concatenate([x.reshape(*lead, -1) for x in arrays], axis=-1)]

    return Rule((hf,), tuple(ours), to_ours, to_hf)


def flatten(tree, prefix: str = "") -> dict:
    """Nested dicts -> ``{"a/b/c": leaf}``."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}/{key}" if prefix else key))
    return out


def unflatten(leaves: dict) -> dict:
    """``{"a/b/c": leaf}`` -> nested dicts."""
    out: dict = {}
    for path, leaf in leaves.items():
        node = out
        *parents, last = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = leaf
    return out


def _layer_rules(mapping: Mapping, abstract: dict):
    """``(rule, hf names, our paths, our shapes, layer)`` for every use of every rule;
    ``layer`` is None for top rules, else ``(scanned, i, L)``. Shapes are per layer (no
    ``[L]`` axis); None where ``abstract`` has no such path."""

    def shape(path, scanned):
        return None if path not in abstract else abstract[path].shape[1 if scanned else 0 :]

    for rule in mapping.top:
        yield rule, rule.hf, rule.ours, [shape(p, False) for p in rule.ours], None
    for stack, layers, rules in mapping.stacks:
        scanned = any(p.startswith(f"{stack}/layers/") for p in abstract)
        for i in range(layers):
            for rule in rules:
                names = tuple(n.format(i=i) for n in rule.hf)
                where = f"{stack}/layers" if scanned else f"{stack}/layer_{i}"
                paths = tuple(f"{where}/{p}" for p in rule.ours)
                yield rule, names, paths, [shape(p, scanned) for p in paths], (scanned, i, layers)


def import_params(tensors: dict, mapping: Mapping, abstract: dict) -> dict:
    """HF ``tensors`` -> flat ``{path: float32 array}`` matching ``abstract`` (flat shapes)."""
    out, stacked, used = {}, {}, set()
    for rule, names, paths, shapes, layer in _layer_rules(mapping, abstract):
        for name in names:
            if name not in tensors:
                raise HFError(f"model.safetensors has no tensor {name!r}")
        expected = rule.to_hf([np.zeros(s, np.float32) for s in shapes])
        for name, want in zip(names, expected, strict=True):
            if tensors[name].shape != want.shape:
                raise HFError(
                    f"tensor {name!r} has shape {tuple(tensors[name].shape)} but this config "
                    f"needs {tuple(want.shape)}"
                )
        used.update(names)
        arrays = rule.to_ours([tensors[n] for n in names], shapes)
        for path, array in zip(paths, arrays, strict=True):
            array = np.asarray(array, np.float32)
            if layer is not None and layer[0]:
                stacked.setdefault(path, [None] * layer[2])[layer[1]] = array
            else:
                out[path] = array
    out.update({path: np.stack(parts) for path, parts in stacked.items()})
    extra = sorted(n for n in tensors if n not in used and not re.search(mapping.ignored, n))
    if extra:
        raise HFError(
            f"model.safetensors holds tensor {extra[0]!r} that this config has no place for"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
        )
    missing = sorted(set(abstract) - set(out))
    if missing:
        raise HFError(f"no Hugging Face tensor maps to tfmjax parameter {missing[0]!r}")
    return out


def export_params(params: dict, mapping: Mapping, dtype: np.dtype) -> dict:
    """Flat tfmjax ``{path: array}`` -> HF ``{name: array}`` in ``dtype``."""
    params = {p: np.asarray(jax.device_get(a)) for p, a in params.items()}
    out, used = {}, set()
    for rule, names, paths, _, layer in _layer_rules(mapping, params):
        missing = [p for p in paths if p not in params]
        if missing:
            raise HFError(f"params have no {missing[0]!r}")
        used.update(paths)
        arrays = [params[p][layer[1]] if layer and layer[0] else params[p] for p in paths]
        for name, array in zip(names, rule.to_hf(arrays), strict=True):
            out[name] = np.ascontiguousarray(array).astype(dtype)
    extra = sorted(set(params) - used)
    if extra:
        raise HFError(f"tfmjax parameter {extra[0]!r} has no Hugging Face counterpart here")
    return out


def covered_paths(mapping: Mapping, abstract: dict) -> set[str]:
    """The tfmjax paths the rules of ``mapping`` fill (every leaf of ``abstract``, if complete)."""
    return {p for _, _, paths, _, _ in _layer_rules(mapping, abstract) for p in paths}
