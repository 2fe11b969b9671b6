"""Sequence-manipulation tasks: copy, reverse, sort, Dyck completion, associative recall,
induction head.

All lengths are in tokens and exclude BOS/EOS. For every task here the "length"
split draws its length parameter from (max, 2 * max] instead of [min, max].
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from tfmjax.data.base import Example, Task, check_int, symbol_names
from tfmjax.data.vocab import Vocab


def _draw_len(rng: np.random.Generator, lo: int, hi: int, long: bool) -> int:
    """Uniform length in [lo, hi], or in (hi, 2 * hi] when long."""
    return int(rng.integers(hi + 1, 2 * hi + 1)) if long else int(rng.integers(lo, hi + 1))


# --------------------------------------------------------------------------- copy / reverse / sort


@dataclasses.dataclass(frozen=True, kw_only=True)
class _SymbolSequenceTask(Task):
    """Source: `min_len..max_len` symbols drawn uniformly (with repeats) from `num_symbols`."""

    num_symbols: int = 10
    min_len: int = 1
    max_len: int = 10

    def __post_init__(self) -> None:
        check_int(self.name, "num_symbols", self.num_symbols, 2)
        check_int(self.name, "min_len", self.min_len, 1)
        check_int(self.name, "max_len", self.max_len, self.min_len)
        object.__setattr__(self, "vocab", Vocab(symbol_names(self.num_symbols)))

    @property
    def digit_ids(self) -> tuple[int, ...]:
        """With 10 symbols, they are the "digits" of Abacus places: a sequence is one
        number, so an answer symbol and the source symbol it comes from can share a place
        (position coupling). Other symbol counts write no digits."""
        if self.num_symbols != 10:
            return ()
        return tuple(range(self._first_symbol, self._first_symbol + 10))

    @property
    def _first_symbol(self) -> int:
        """The id of the first symbol (the symbols close the vocabulary)."""
        return self.vocab.size - self.num_symbols

    def _generate(self, rng: np.random.Generator, long: bool) -> Example:
        n = _draw_len(rng, self.min_len, self.max_len, long)
        first = self._first_symbol
        source = (rng.integers(0, self.num_symbols, size=n) + first).tolist()
        return source, self._answer(source)

    def _max_lengths(self, long: bool) -> tuple[int, int]:
        n = 2 * self.max_len if long else self.max_len
        return n, n

    def _answer(self, source: list[int]) -> list[int]:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, kw_only=True)
class CopyTask(_SymbolSequenceTask):
    """ "c a b" -> "c a b"."""

    name: ClassVar[str] = "copy"

    def _answer(self, source: list[int]) -> list[int]:
        return list(source)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReverseTask(_SymbolSequenceTask):
    """ "c a b" -> "b a c"."""

    name: ClassVar[str] = "reverse"

    def _answer(self, source: list[int]) -> list[int]:
        return source[::-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SortTask(_SymbolSequenceTask):
    """ "c a b a" -> "a a b c" (ascending symbol order, repeats kept)."""

    name: ClassVar[str] = "sort"

    def _answer(self, source: list[int]) -> list[int]:
        return sorted(source)


# --------------------------------------------------------------------------- Dyck completion

_BRACKETS = (("(", ")"), ("[", "]"), ("{", "}"), ("<", ">"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DyckTask(Task):
    """Complete a Dyck prefix: "( [ ] (" -> ") )".

    Source: `min_len..max_len` brackets of `num_types` kinds forming a prefix of
    some balanced sequence, nesting depth <= `max_depth`, at least one bracket
    left open. Target: the unique shortest closing sequence (the open brackets'
    closers, innermost first). The length split has longer sources, same max depth.
    """

    name: ClassVar[str] = "dyck"
    num_types: int = 2
    min_len: int = 1
    max_len: int = 12
    max_depth: int = 6

    def __post_init__(self) -> None:
        check_int(self.name, "num_types", self.num_types, 1, len(_BRACKETS))
        check_int(self.name, "min_len", self.min_len, 1)
        check_int(self.name, "max_len", self.max_len, self.min_len)
        check_int(self.name, "max_depth", self.max_depth, 2)
        pairs = _BRACKETS[: self.num_types]
        object.__setattr__(self, "vocab", Vocab([b for pair in pairs for b in pair]))

    def _generate(self, rng: np.random.Generator, long: bool) -> Example:
        n = _draw_len(rng, self.min_len, self.max_len, long)
        coins = rng.random(n)
        kinds = rng.integers(0, self.num_types, size=n).tolist()
        first = self.vocab.size - 2 * self.num_types  # id of the first opener; closer = opener + 1
        source: list[int] = []
        stack: list[int] = []  # ids of the closers still owed
        for t in range(n):
            last = t == n - 1
            if not stack or (last and len(stack) == 1):
                do_open = True  # never end balanced: the target must be non-empty
            elif len(stack) == self.max_depth:
                do_open = False
            else:
                do_open = coins[t] < 0.5
            if do_open:
                opener = first + 2 * kinds[t]
                source.append(opener)
                stack.append(opener + 1)
            else:
                source.append(stack.pop())
        return source, stack[::-1]

    def _max_lengths(self, long: bool) -> tuple[int, int]:
        n = 2 * self.max_len if long else self.max_len
        return n, min(n, self.max_depth)


# --------------------------------------------------------------------------- associative recall


@dataclasses.dataclass(frozen=True, kw_only=True)
class AssociativeRecallTask(Task):
    """Key-value lookup: "c 3 a 7 e 3 ? a" -> "7".

    Source: `min_pairs..max_pairs` (key, value) pairs with distinct keys (letters,
    `num_keys` of them) and values (digits, `num_values`, repeats allowed), then
    "?" and a query key chosen among the pairs' keys; length 2 * pairs + 2.
    Target: the query's value (1 token). The length split has more pairs
    (up to min(2 * max_pairs, num_keys)); it exists only if max_pairs < num_keys.
    """

    name: ClassVar[str] = "associative_recall"
    num_keys: int = 16
    num_values: int = 10
    min_pairs: int = 1
    max_pairs: int = 6

    def __post_init__(self) -> None:
        check_int(self.name, "num_keys", self.num_keys, 2, 26)
        check_int(self.name, "num_values", self.num_values, 2, 10)
        check_int(self.name, "min_pairs", self.min_pairs, 1)
        check_int(self.name, "max_pairs", self.max_pairs, self.min_pairs, self.num_keys)
        keys = symbol_names(self.num_keys)
        values = [str(d) for d in range(self.num_values)]
        object.__setattr__(self, "vocab", Vocab(keys + values + ["?"]))

    @property
    def supports_length_split(self) -> bool:
        return self.max_pairs < self.num_keys

    def _no_length_reason(self) -> str:
        return (
            f"max_pairs ({self.max_pairs}) must be < num_keys ({self.num_keys}) "
            "to have longer examples"
        )

    def _pairs_range(self, long: bool) -> tuple[int, int]:
        if long:
            return self.max_pairs + 1, min(2 * self.max_pairs, self.num_keys)
        return self.min_pairs, self.max_pairs

    def _generate(self, rng: np.random.Generator, long: bool) -> Example:
        lo, hi = self._pairs_range(long)
        n = int(rng.integers(lo, hi + 1))
        key0 = self.vocab.size - self.num_keys - self.num_values - 1
        val0 = key0 + self.num_keys
        keys = (rng.choice(self.num_keys, size=n, replace=False) + key0).tolist()
        values = (rng.integers(0, self.num_values, size=n) + val0).tolist()
        q = int(rng.integers(0, n))
        source = [tok for kv in zip(keys, values, strict=True) for tok in kv]
        source += [self.vocab.size - 1, keys[q]]  # "?" is the last symbol
        return source, [values[q]]

    def _max_lengths(self, long: bool) -> tuple[int, int]:
        return 2 * self._pairs_range(long)[1] + 2, 1


# --------------------------------------------------------------------------- induction head


@dataclasses.dataclass(frozen=True, kw_only=True)
class InductionHeadTask(Task):
    """Induction head: "... q x y ... q" -> "x y" (what followed the earlier q).

    Source: `min_len..max_len` random symbols. Its last token q occurs exactly
    once before, at a uniform position i, and is followed there by at least
    `continuation_len` tokens; no other token equals q. Target: the
    `continuation_len` tokens after that earlier q, i.e. the continuation of the
    repeated segment. Only an "attend to the token after the previous copy of the
    current token" mechanism solves it. The length split has longer sources.
    """

    name: ClassVar[str] = "induction_head"
    num_symbols: int = 16
    min_len: int = 6
    max_len: int = 16
    continuation_len: int = 1

    def __post_init__(self) -> None:
        check_int(self.name, "num_symbols", self.num_symbols, 2)
        check_int(self.name, "continuation_len", self.continuation_len, 1)
        check_int(self.name, "min_len", self.min_len, self.continuation_len + 2)
        check_int(self.name, "max_len", self.max_len, self.min_len)
        object.__setattr__(self, "vocab", Vocab(symbol_names(self.num_symbols)))

    def _generate(self, rng: np.random.Generator, long: bool) -> Example:
        n = _draw_len(rng, self.min_len, self.max_len, long)
        k = self.continuation_len
        first = self.vocab.size - self.num_symbols
        q = int(rng.integers(0, self.num_symbols))
        body = rng.integers(0, self.num_symbols - 1, size=n - 1)
        body += body >= q  # skip q: body holds every symbol but q
        i = int(rng.integers(0, n - 1 - k))  # earlier q at i; i + k <= n - 2
        body[i] = q
        source = (body + first).tolist() + [q + first]
        return source, source[i + 1 : i + 1 + k]

    def _max_lengths(self, long: bool) -> tuple[int, int]:
        return (2 * self.max_len if long else self.max_len), self.continuation_len
