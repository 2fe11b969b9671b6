"""Task interface, split names and the hash partition that keeps eval apart from train.

A task maps a source id sequence to a target id sequence (no BOS/EOS; ids index
`task.vocab`). Splits:
  "train"  : in-distribution examples whose source hashes to a train bucket;
  "eval"   : in-distribution examples whose source hashes to the eval bucket
             (1 in `EVAL_BUCKETS`), so eval never overlaps train;
  "length" : longer examples than train/eval ever produce (task-specific).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import inspect
import string
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from tfmjax.data.vocab import Vocab

SPLITS: tuple[str, ...] = ("train", "eval", "length")
EVAL_BUCKETS = 10  # an example is "eval" iff hash(source) % EVAL_BUCKETS == 0
_MAX_TRIES = 10_000  # rejection-sampling budget before declaring a split empty

Example = tuple[list[int], list[int]]  # (source ids, target ids), no BOS/EOS


def example_split(source: Sequence[int]) -> str:
    """ "train" or "eval" for an in-distribution source, by a stable hash (not hash())."""
    data = ",".join(str(int(i)) for i in source).encode()
    h = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    return "eval" if h % EVAL_BUCKETS == 0 else "train"


def symbol_names(n: int) -> list[str]:
    """n distinct readable symbol names: "a".."z" when n <= 26, else "s0".."s{n-1}"."""
    if n <= 26:
        return list(string.ascii_lowercase[:n])
    return [f"s{i}" for i in range(n)]


def parse_params(cls, params: dict[str, Any], what: str):
    """``cls(**params)`` for a dataclass of task parameters; an unknown key is refused in one
    line that names ``what`` (e.g. "a text task") and the valid parameters."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [key for key in params if key not in names]
    if unknown:
        raise ValueError(
            f"unknown parameter {unknown[0]!r} for {what} (valid parameters: {', '.join(names)})"
        )
    return cls(**params)


def check_int(task: str, name: str, value: Any, lo: int, hi: int | None = None) -> None:
    """One-line ValueError unless lo <= value (<= hi) and value is an int."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    ok = ok and value >= lo and (hi is None or value <= hi)
    if not ok:
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"task {task!r}: {name} must be an int {bound}, got {value!r}")


# Members a task overrides to answer a question about itself, read as values
# (``task.supports_length_split``): a subclass may write each as a property, a class
# attribute or a plain method (``def supports_length_split(self): return False``), which
# ``Task.__init_subclass__`` makes a property (a bound method would always be true).
_ANSWERS = ("supports_length_split", "digit_ids")


class Task(abc.ABC):
    """A seq2seq toy task. Concrete tasks are frozen kw-only dataclasses of their params.

    Subclasses set `vocab` in __post_init__ and implement `_generate` and `_max_lengths`;
    they may override `canonical_input` (how a person's typed input is read) and
    `supports_length_split`. `name` defaults to the class name. docs/own_data.md walks
    through one (`data.task = "PATH.py:Class"`).
    """

    name: ClassVar[str]
    vocab: Vocab

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not any("name" in vars(klass) for klass in cls.__mro__):  # a value or a property
            cls.name = cls.__name__
        if inspect.isfunction(vars(cls).get("name")):
            raise TypeError(
                f"task {cls.__name__}: name is a method; give it as a class attribute "
                f"(name = {cls.__name__.lower()!r}) or a property"
            )
        for member in _ANSWERS:  # written as a plain method, each still answers as a value
            if inspect.isfunction(vars(cls).get(member)):
                setattr(cls, member, property(vars(cls)[member]))

    @property
    def digit_ids(self) -> tuple[int, ...]:
        """The ids of the digits 0-9 in order (Abacus places, McLeish et al. 2024); empty
        when the task writes no numbers."""
        return ()

    @property
    def supports_length_split(self) -> bool:
        """Whether split "length" exists for this task (and these params)."""
        return True

    @property
    def params(self) -> dict[str, Any]:
        """Constructor params, e.g. for logging: make_task(task.name, **task.params) rebuilds it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}  # type: ignore[arg-type]

    def check_split(self, split: str) -> None:
        """ValueError for an unknown split, or "length" on a task without one."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        if split == "length" and not self.supports_length_split:
            raise ValueError(
                f"task {self.name!r} has no 'length' split: {self._no_length_reason()}"
            )

    def sample(self, rng: np.random.Generator, split: str) -> Example:
        """One (source ids, target ids) pair of `split`, without BOS/EOS; uses only `rng`."""
        self.check_split(split)
        long = split == "length"
        for _ in range(_MAX_TRIES):
            source, target = self._generate(rng, long)
            if long or example_split(source) == split:
                return source, target
        raise RuntimeError(
            f"task {self.name!r}: no {split!r} example found in {_MAX_TRIES} draws; "
            f"the example space of {self!r} is too small"
        )

    def max_source_len(self, split: str) -> int:
        """Longest source (no BOS/EOS) `split` can produce; "train" and "eval" agree."""
        self.check_split(split)
        return self._max_lengths(split == "length")[0]

    def max_target_len(self, split: str) -> int:
        """Longest target (no BOS/EOS) `split` can produce; "train" and "eval" agree."""
        self.check_split(split)
        return self._max_lengths(split == "length")[1]

    def canonical_input(self, text: str) -> str:
        """A user's space-separated source as the task writes it (the identity, unless a
        task's format adds something a person would leave out, such as leading zeros)."""
        return text

    @abc.abstractmethod
    def _generate(self, rng: np.random.Generator, long: bool) -> Example:
        """A raw example, in-distribution (long=False) or from the length split (long=True)."""

    @abc.abstractmethod
    def _max_lengths(self, long: bool) -> tuple[int, int]:
        """(max source len, max target len) for in-distribution or length-split examples."""

    def _no_length_reason(self) -> str:
        return "not defined for this task"
