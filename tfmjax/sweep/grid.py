"""The runs of a sweep: ``--seeds`` x ``--grid key=v1,v2`` axes, expanded and validated.

Every run is the base config (the TOML plus the sweep's own ``section.key=value``
overrides) with one value of each grid axis and one seed (``train.seed``), trained in its
own workdir ``<sweep dir>/<point>/seed=<s>``; a point is named by its values, ``lr`` style
short keys (``learning_rate=1e-3,position=rope``), or ``base`` for a sweep of seeds only.
Every run's config is loaded (and so validated) before anything trains.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from tfmjax.config.errors import ConfigError
from tfmjax.config.loading import load
from tfmjax.config.sections import Experiment

# Set by the sweep itself for every run: never a grid axis nor a base override.
RESERVED = {"train.seed": "--seeds", "train.workdir": "--workdir"}


@dataclasses.dataclass(frozen=True)
class Axis:
    """One ``--grid`` option: a dotted config key and its values as written (``1e-3``)."""

    key: str
    values: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run: its grid point (``((key, value text), ...)``), seed, workdir and config."""

    point: tuple[tuple[str, str], ...]
    point_name: str
    seed: int
    workdir: Path
    overrides: tuple[str, ...]  # what train.py is given after the config path
    experiment: Experiment

    @property
    def name(self) -> str:
        return f"{self.point_name}/seed={self.seed}"


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` or a range ``0-4`` (both ends in) -> seeds; ConfigError for anything else."""
    try:
        if "-" in text and "," not in text:
            lo, hi = (int(part) for part in text.split("-"))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(part) for part in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ConfigError(
            f"--seeds {text!r}: give distinct seeds >= 0 as 0,1,2 or a range such as 0-4"
        )
    return seeds


def _key_of(item: str, option: str) -> str:
    key, sep, _ = item.partition("=")
    key = key.strip()
    if not sep or len(key.split(".")) < 2 or not all(key.split(".")):
        raise ConfigError(
            f"{option} {item!r} must look like section.key=value, for example "
            "optim.learning_rate=1e-3"
        )
    if key in RESERVED:
        raise ConfigError(f"{option} {item!r}: the sweep sets {key} itself; use {RESERVED[key]}")
    return key


def parse_axes(grids: list[str], overrides: list[str]) -> list[Axis]:
    """``--grid key=v1,v2`` options -> axes; ConfigError naming a malformed or repeated one."""
    fixed = {_key_of(item, "override") for item in overrides}
    axes: list[Axis] = []
    for item in grids:
        key = _key_of(item, "--grid")
        values = tuple(v.strip() for v in item.partition("=")[2].split(","))
        if not all(values):
            raise ConfigError(f"--grid {item!r} has an empty value; write key=v1,v2,...")
        if len(set(values)) != len(values):
            raise ConfigError(f"--grid {item!r} repeats a value; give each value once")
        if key in fixed or any(a.key == key for a in axes):
            raise ConfigError(f"--grid {item!r}: {key} is set twice; give it once")
        axes.append(Axis(key, values))
    return axes


def short_names(axes: list[Axis]) -> dict[str, str]:
    """Each axis key's short name in run names: its last part, unless two axes share it."""
    last = [axis.key.rpartition(".")[2] for axis in axes]
    return {a.key: (s if last.count(s) == 1 else a.key) for a, s in zip(axes, last, strict=True)}


def point_name(point: tuple[tuple[str, str], ...], short: dict[str, str]) -> str:
    """``learning_rate=1e-3,position=rope`` (a ``/`` in a value becomes ``_``); ``base``."""
    if not point:
        return "base"
    return ",".join(f"{short[key]}={value.replace('/', '_')}" for key, value in point)


def expand(
    config: str | Path, overrides: list[str], axes: list[Axis], seeds: list[int], sweep_dir: Path
) -> list[RunSpec]:
    """Every (grid point, seed) run, each config loaded now: the first bad one raises a
    ConfigError of one line naming its point."""
    load(config, overrides)  # the base alone first: its error names no grid point
    short = short_names(axes)
    runs = []
    for values in itertools.product(*(axis.values for axis in axes)):
        point = tuple((axis.key, value) for axis, value in zip(axes, values, strict=True))
        name = point_name(point, short)
        grid = [f"{key}={value}" for key, value in point]
        try:
            load(config, [*overrides, *grid])
        except ConfigError as err:
            raise ConfigError(f"grid point {name}: {err}") from None
        for seed in seeds:
            workdir = sweep_dir / name / f"seed={seed}"
            args = (*overrides, *grid, f"train.seed={seed}", f"train.workdir={workdir}")
            runs.append(RunSpec(point, name, seed, workdir, args, load(config, args)))
    return runs
