"""Multi-digit addition: "1 2 3 + 4 5" -> "1 6 8" (or "8 6 1" with reversed_answer)."""

from __future__ import annotations

import dataclasses

import numpy as np

from tfmjax.data.base import Example, Task, check_int
from tfmjax.data.vocab import Vocab

_DIGITS = [str(d) for d in range(10)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdditionTask(Task):
    """a + b for non-negative decimal integers, one token per digit.

    Source: digits of a (most significant first, no leading zeros), "+", digits
    of b; in-distribution a, b are uniform in [0, 10**num_digits). Target: the
    digits of a + b, most significant first, or least significant first when
    `reversed_answer` (the carry-friendly order; operands stay most significant
    first). With `exact_digits`, in-distribution operands have exactly num_digits
    digits (what a length-generalisation study evaluates at). With `pad_operands`,
    both operands are written with leading zeros to the split's widest operand
    (num_digits; 2 * num_digits in the length split), so digits of the same place
    value sit at the same offset from "+" and from the end (the zero-padding of
    Lee et al. 2024); the answer keeps no leading zeros. With `reversed_operands`,
    the operands are written least significant first too (padding zeros then trail), so
    with `reversed_answer` every number reads in the same order and a digit's place within
    its number is its place value (McLeish et al. 2024's setting for Abacus places).
    Length split: both operands have num_digits+1 .. 2*num_digits digits.
    """

    num_digits: int = 3
    reversed_answer: bool = False
    exact_digits: bool = False
    pad_operands: bool = False
    reversed_operands: bool = False

    def __post_init__(self) -> None:
        check_int("addition", "num_digits", self.num_digits, 1)
        for flag in ("reversed_answer", "exact_digits", "pad_operands", "reversed_operands"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(
                    f"task {self.name!r}: {flag} must be a bool, got {getattr(self, flag)!r}"
                )
        object.__setattr__(self, "vocab", Vocab(_DIGITS + ["+"]))

    @property
    def name(self) -> str:  # type: ignore[override]
        return "addition_reversed" if self.reversed_answer else "addition"

    @property
    def digit_ids(self) -> tuple[int, ...]:
        return tuple(self.vocab.token_id(d) for d in _DIGITS)

    def _operand(self, rng: np.random.Generator, long: bool) -> int:
        if long or self.exact_digits:  # exactly d digits
            d = self.num_digits
            if long:  # d uniform in (num_digits, 2 * num_digits]
                d = int(rng.integers(self.num_digits + 1, 2 * self.num_digits + 1))
            digits = [int(rng.integers(1, 10))] + rng.integers(0, 10, size=d - 1).tolist()
        else:  # uniform in [0, 10**num_digits), built digit-wise so any num_digits works
            digits = rng.integers(0, 10, size=self.num_digits).tolist()
        return int("".join(map(str, digits)))

    def _digits(self, n: int, width: int = 0) -> list[int]:
        """The digits of n, most significant first, with leading zeros up to `width`."""
        return [self.vocab.token_id(c) for c in str(n).zfill(width)]

    def _operand_digits(self, n: int, width: int) -> list[int]:
        """An operand as written: :meth:`_digits`, reversed with `reversed_operands`."""
        digits = self._digits(n, width)
        return digits[::-1] if self.reversed_operands else digits

    def canonical_input(self, text: str) -> str:
        """ "4 5 + 1 2 3" -> "0 4 5 + 1 2 3" with pad_operands (num_digits 3): both operands
        at the width the task writes them in, num_digits, or 2 * num_digits when one is longer
        (the length split's). Anything else, such as an empty operand, is left as given."""
        operands = ["".join(side.split()) for side in text.split("+")]
        if not self.pad_operands or len(operands) != 2 or not all(operands):
            return text
        width = self._widest(long=max(map(len, operands)) > self.num_digits)
        pad = (
            (lambda o: o.ljust(width, "0"))
            if self.reversed_operands
            else (lambda o: o.zfill(width))
        )
        return " + ".join(" ".join(pad(o)) for o in operands)

    def _generate(self, rng: np.random.Generator, long: bool) -> Example:
        a, b = self._operand(rng, long), self._operand(rng, long)
        width = self._widest(long) if self.pad_operands else 0
        plus = [self.vocab.token_id("+")]
        source = self._operand_digits(a, width) + plus + self._operand_digits(b, width)
        target = self._digits(a + b)
        return source, target[::-1] if self.reversed_answer else target

    def _widest(self, long: bool) -> int:
        """The most digits an operand of the split has: num_digits, or 2 * num_digits."""
        return 2 * self.num_digits if long else self.num_digits

    def _max_lengths(self, long: bool) -> tuple[int, int]:
        d = self._widest(long)
        return 2 * d + 1, d + 1
