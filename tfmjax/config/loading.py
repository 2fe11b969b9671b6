"""Building an :class:`Experiment`: from nested dicts (TOML or checkpoint JSON), from a TOML
file, and with ``section.key=value`` overrides. No config file is executed."""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from pathlib import Path
from typing import Any

from tfmjax.config.errors import ConfigError
from tfmjax.config.presets import get_preset
from tfmjax.config.sections import SECTIONS, Experiment


def _suggest(key: str, options) -> str:
    """`` (did you mean 'x'?)`` for the closest option, or ""."""
    close = difflib.get_close_matches(key, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# Short names other tools use for a key, too far from it for difflib: (section, key) -> key.
ALIASES = {
    "lr": "optim.learning_rate",
    "learning_rate": "optim.learning_rate",
    "wd": "optim.weight_decay",
    "weight_decay": "optim.weight_decay",
    "warmup": "optim.warmup_steps",
    "bs": "data.batch_size",
    "batch": "data.batch_size",
    "batch_size": "data.batch_size",
    "max_steps": "train.steps",
    "seq_len": "model.max_len",
}


def _suggest_key(section: str, key: str, names) -> str:
    """`` (did you mean 'x'?)``: a known alias (in whichever section it lives), else the
    closest key of ``section``."""
    alias = ALIASES.get(key)
    if alias and alias != f"{section}.{key}":
        return f" (did you mean {alias!r}?)"
    return _suggest(key, names)


def _build_section(section: str, values: dict) -> Any:
    """One section's config from its keys (``model.preset`` first, when given)."""
    cls = SECTIONS[section]
    values = dict(values)
    base = cls()
    if section == "model" and "preset" in values:
        base = get_preset(values.pop("preset"))
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            raise ConfigError(
                f"unknown key {section}.{key}{_suggest_key(section, key, names)}; "
                f"valid keys: {', '.join(sorted(names))}"
            )
    # An override ``key=none`` reads as None; for a field that takes only strings (e.g.
    # model.position) it means the string "none". TOML has no null: there, the string
    # "none" of a field that may be None (and takes no strings) is None.
    for f in dataclasses.fields(cls):
        value = values.get(f.name, "")
        if value is None and f.type == "str":
            values[f.name] = "none"
        elif value == "none" and "None" in str(f.type) and "str" not in str(f.type):
            values[f.name] = None
    return dataclasses.replace(base, **values)


def from_dict(raw: dict, name: str = "experiment") -> Experiment:
    """Build an :class:`Experiment` from nested dicts (TOML or checkpoint JSON)."""
    raw = dict(raw)
    name = raw.pop("name", name)
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(
                f"unknown section [{key}]{_suggest(key, SECTIONS)}; "
                f"valid sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(raw[key], dict):
            raise ConfigError(f"[{key}] must be a table of key = value lines, got {raw[key]!r}")
    sections = {key: _build_section(key, raw.get(key, {})) for key in SECTIONS}
    return Experiment(name=name, **sections)


def parse_value(text: str) -> Any:
    """A TOML value (``3``, ``1e-3``, ``true``, ``"s"``), ``none`` for None, else the string."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict, overrides) -> dict:
    """Apply ``section.key=value`` (or ``section.key.sub=value``) strings to nested dicts."""
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for item in overrides:
        path, sep, text = item.partition("=")
        keys = path.strip().split(".")
        if not sep or len(keys) < 2 or not all(keys):
            raise ConfigError(
                f"override {item!r} must look like section.key=value, for example model.d_model=128"
            )
        node = raw
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {key} is a value, not a table")
        node[keys[-1]] = parse_value(text.strip())
    return raw


def load(path: str | Path, overrides=()) -> Experiment:
    """Read a TOML experiment (never executed) and apply ``section.key=value`` overrides.

    An override ``model.preset=NAME`` starts the model section afresh from that preset: the
    file's own ``[model]`` keys are dropped, and only model keys given on the command line
    too apply on top (so ``model.preset=gpt2-small`` gives GPT-2 small itself).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"config {str(path)!r} is a directory; pass a TOML file such as configs/reverse.toml"
        )
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; see configs/ for examples")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return from_overridden(raw, overrides, name=path.stem)


def from_overridden(raw: dict, overrides=(), name: str = "experiment") -> Experiment:
    """:func:`from_dict` of ``raw`` (a TOML file's tables, or a dict of them) with
    ``section.key=value`` overrides applied as :func:`load` applies them (a ``model.preset``
    override starts the model section afresh). ``raw["name"]``, if given, names it."""
    if any(item.partition("=")[0].strip() == "model.preset" for item in overrides):
        raw = {**raw, "model": {}}
    return from_dict(apply_overrides(raw, overrides), name=name)
