"""Validation helpers the config sections call in ``__post_init__``: each failure is one
:class:`ConfigError` line naming the field, the value and what is valid."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from tfmjax.config.errors import ConfigError


def require(ok: bool, field: str, value: Any, valid: str) -> None:
    """Raise ``field=value is invalid: valid`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{field}={value!r} is invalid: {valid}")


def no_sparse_pattern(cfg: Any, attention: str) -> None:
    """Refuse ``model.window``, ``attention_stride``, ``global_tokens`` and ``random_blocks``
    for an attention variant without block-sparse patterns (``cfg``: the ModelConfig), naming
    the field."""
    for field in ("window", "attention_stride"):
        require(
            getattr(cfg, field) is None,
            f"model.{field}",
            getattr(cfg, field),
            f"sparse patterns apply to softmax and mla attention, not {attention}",
        )
    for field in ("global_tokens", "random_blocks"):
        require(
            getattr(cfg, field) == 0,
            f"model.{field}",
            getattr(cfg, field),
            f"sparse patterns apply to softmax and mla attention, not {attention}",
        )


def one_of(field: str, value: Any, options: tuple) -> None:
    """``value`` must be one of ``options``."""
    require(value in options, field, value, f"must be one of {', '.join(map(str, options))}")


def positive(section: str, obj: Any, *names: str) -> None:
    """Each named field of ``obj`` is None or > 0."""
    for name in names:
        value = getattr(obj, name)
        if value is not None:
            require(value > 0, f"{section}.{name}", value, "must be > 0")


def check_types(section: str, obj: Any) -> None:
    """Check every field against its annotation (int, float, bool, str, optional, dict)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, f.name, float(value))
            continue
        ok = any(
            isinstance(value, t) and not (t is int and isinstance(value, bool))
            for t in allowed
            if t is not type(None)
        )
        names = " or ".join("none" if t is type(None) else t.__name__ for t in allowed)
        require(ok, f"{section}.{f.name}", value, f"must be {names}")
