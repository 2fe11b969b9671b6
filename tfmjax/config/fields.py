"""A config field with its one line of help beside it, printed by
``python -m tfmjax.config.explain``."""

from __future__ import annotations

import dataclasses
from typing import Any


def option(
    default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING
) -> Any:
    """``dataclasses.field`` with ``metadata={"help": help}``."""
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={"help": help}
    )


def help_of(field: dataclasses.Field) -> str:
    """The help line of a config field ("" when it has none)."""
    return field.metadata.get("help", "")
