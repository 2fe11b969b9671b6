"""SCAN-like command -> action translation, generated offline from the SCAN grammar.

    C -> S | S and S | S after S
    S -> V | V twice | V thrice
    V -> U | A D | A opposite D | A around D
    A -> U | turn        U -> walk | look | run | jump        D -> left | right

Meaning: U -> its action (WALK, LOOK, RUN, JUMP), "turn" -> no action;
"A D" -> TURN_D [A]; "A opposite D" -> TURN_D TURN_D [A]; "A around D" ->
(TURN_D [A]) x 4; "x twice" -> x x; "x thrice" -> x x x; "x and y" -> x y;
"x after y" -> y x. TURN_left = LTURN, TURN_right = RTURN.
Example: "jump twice and walk left" -> "JUMP JUMP LTURN WALK".
All 20,910 commands are enumerated once; examples are drawn uniformly from them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import numpy as np

from tfmjax.data.base import Example, Task, check_int, example_split
from tfmjax.data.vocab import Vocab

PRIMITIVES = ("walk", "look", "run", "jump")
DIRECTIONS = ("left", "right")
COMMAND_WORDS = (
    PRIMITIVES + ("turn",) + DIRECTIONS + ("opposite", "around", "twice", "thrice", "and", "after")
)
ACTIONS = ("WALK", "LOOK", "RUN", "JUMP", "LTURN", "RTURN")
SCAN_VOCAB = Vocab(COMMAND_WORDS + ACTIONS)
MAX_COMMAND_WORDS = 9  # "jump around left thrice and walk opposite right twice"
MAX_ACTIONS = 48  # "X around D thrice and Y around D thrice"


def _verb_phrases() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Every V as (words, actions)."""
    out = [((u,), (u.upper(),)) for u in PRIMITIVES]
    for a in PRIMITIVES + ("turn",):
        act = () if a == "turn" else (a.upper(),)
        for d in DIRECTIONS:
            t = ("LTURN",) if d == "left" else ("RTURN",)
            out.append(((a, d), t + act))
            out.append(((a, "opposite", d), t + t + act))
            out.append(((a, "around", d), (t + act) * 4))
    return out


def enumerate_commands() -> list[tuple[str, str]]:
    """All 20,910 (command, actions) string pairs of the grammar, in a fixed order."""
    sentences = []
    for words, acts in _verb_phrases():
        sentences.append((words, acts))
        sentences.append((words + ("twice",), acts * 2))
        sentences.append((words + ("thrice",), acts * 3))
    out = [(" ".join(w), " ".join(a)) for w, a in sentences]
    for w1, a1 in sentences:
        for w2, a2 in sentences:
            out.append((" ".join(w1 + ("and",) + w2), " ".join(a1 + a2)))
            out.append((" ".join(w1 + ("after",) + w2), " ".join(a2 + a1)))
    return out


@functools.cache
def _encoded_commands() -> tuple[tuple[list[int], list[int], str], ...]:
    """All commands as (source ids, target ids, "train"|"eval" hash bucket)."""
    out = []
    for cmd, act in enumerate_commands():
        src = SCAN_VOCAB.encode(cmd)
        out.append((src, SCAN_VOCAB.encode(act), example_split(src)))
    return tuple(out)


@functools.cache
def _pools(max_actions: int) -> dict[str, tuple[tuple[list[int], list[int]], ...]]:
    """Commands per split: train/eval (and their union "in") have <= max_actions actions,
    length more."""
    pools: dict[str, list[tuple[list[int], list[int]]]] = {
        "train": [],
        "eval": [],
        "length": [],
        "in": [],
    }
    for src, tgt, bucket in _encoded_commands():
        if len(tgt) > max_actions:
            pools["length"].append((src, tgt))
        else:
            pools[bucket].append((src, tgt))
            pools["in"].append((src, tgt))
    return {k: tuple(v) for k, v in pools.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScanTask(Task):
    """SCAN-like commands -> actions (see module docstring).

    Train/eval: commands with at most `max_actions` actions (default 22, SCAN's
    length split), partitioned by source hash. Length split: commands with more
    actions (up to 48); sources stay <= 9 words, so "longer" means longer targets.
    """

    name: ClassVar[str] = "scan"
    max_actions: int = 22

    def __post_init__(self) -> None:
        check_int(self.name, "max_actions", self.max_actions, 1)
        object.__setattr__(self, "vocab", SCAN_VOCAB)

    @property
    def supports_length_split(self) -> bool:
        return self.max_actions < MAX_ACTIONS

    def _no_length_reason(self) -> str:
        return (
            f"max_actions={self.max_actions} already admits every command "
            f"(the longest has {MAX_ACTIONS} actions)"
        )

    def sample(self, rng: np.random.Generator, split: str) -> Example:
        """Uniform over the split's pre-partitioned commands (no rejection needed)."""
        self.check_split(split)
        return self._draw(rng, split)

    def _draw(self, rng: np.random.Generator, pool_name: str) -> Example:
        pool = _pools(self.max_actions)[pool_name]
        if not pool:
            raise ValueError(
                f"task 'scan': no {pool_name!r} commands with max_actions={self.max_actions}"
            )
        src, tgt = pool[int(rng.integers(0, len(pool)))]
        return list(src), list(tgt)

    def _generate(self, rng: np.random.Generator, long: bool) -> Example:
        return self._draw(rng, "length" if long else "in")

    def _max_lengths(self, long: bool) -> tuple[int, int]:
        return _pool_max_lengths(self.max_actions, "length" if long else "in")


@functools.cache
def _pool_max_lengths(max_actions: int, pool_name: str) -> tuple[int, int]:
    pool = _pools(max_actions)[pool_name]
    return max((len(s) for s, _ in pool), default=0), max((len(t) for _, t in pool), default=0)
