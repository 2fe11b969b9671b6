"""Integrity: bit-exact hashes of pytrees, and the array table a restore target must match."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import numpy as np

from tfmjax.parallel.processes import to_host


def _key_name(key: Any) -> str:
    """One path entry as text: DictKey, GetAttrKey, SequenceKey or FlattenedIndexKey."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _path_str(path: tuple) -> str:
    """``params/dense/kernel``: the same for a dict and a dataclass with the same field names."""
    return "/".join(_key_name(k) for k in path)


def _flatten(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs sorted by path."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return sorted(((_path_str(path), leaf) for path, leaf in leaves), key=lambda item: item[0])


def params_hash(tree: Any) -> str:
    """sha256 (hex) over every leaf's path, dtype, shape and bytes, in path-sorted order.

    Bit-exact: equal hashes mean equal trees (the same leaves at the same paths with the same
    dtypes, shapes and bits). A dict and a dataclass with the same field names hash the same.
    Typed PRNG keys are hashed as their key data under their key dtype name.
    """
    return state_hashes(tree, None)[0]


def state_hashes(tree: Any, sub: str | None) -> tuple[str, str | None]:
    """``(params_hash(tree), params_hash(tree[sub]))`` with one device-to-host copy."""
    entries = []
    for path, leaf in _flatten(tree):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            entries.append((path, str(dtype), jax.random.key_data(leaf)))
        else:
            entries.append((path, None, leaf))
    hosts = to_host([leaf for _, _, leaf in entries])  # one batched copy (gathered if split)
    full, part = hashlib.sha256(), hashlib.sha256()
    for (path, dtype, _), host in zip(entries, hosts, strict=True):
        array = np.ascontiguousarray(np.asarray(host))
        header = f"\0{dtype or array.dtype}\0{array.shape}\0{array.nbytes}\0".encode()
        data = array.reshape(-1).view(np.uint8).data
        full.update(path.encode() + header)
        full.update(data)
        # Paths under ``sub`` sort the same with or without the ``sub/`` prefix.
        if sub is not None and (path == sub or path.startswith(sub + "/")):
            part.update(path[len(sub) + 1 :].encode() + header)
            part.update(data)
    return full.hexdigest(), (part.hexdigest() if sub is not None else None)


def params_path(state: Any) -> str | None:
    """``"params"`` when the state's leaves include a ``params`` entry (dict key or field)."""
    paths = (path for path, _ in _flatten(state))
    return "params" if any(p == "params" or p.startswith("params/") for p in paths) else None


def array_table(tree: Any) -> dict[str, list]:
    """``{path: [shape, dtype]}`` for every leaf: what a restore target must match."""
    table = {}
    for path, leaf in _flatten(tree):
        shape = list(getattr(leaf, "shape", np.shape(leaf)))
        dtype = getattr(leaf, "dtype", None)
        table[path] = [shape, str(dtype if dtype is not None else np.asarray(leaf).dtype)]
    return table


def jsonable(value: Any) -> Any:
    """Plain JSON data: configs with to_dict(), tuples, numpy/jax scalars, paths."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        value = value.to_dict()

    def default(obj):
        if hasattr(obj, "tolist"):
            return obj.tolist()
        return str(obj)

    return json.loads(json.dumps(value, default=default))


def json_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
