"""Parity with a scratchpad: the worked example of your own task (docs/own_data.md).

Train it with ``python train.py configs/parity.toml``, which sets
``data.task = "examples/parity.py:ParityTask"``.

"1 0 1 1" -> "1 1 0 1": target token t is the parity (XOR) of the first t source bits, so
the last one is the parity of them all. Writing the running parity out (a scratchpad) makes
each step local: one bit of the source and the token before. Asked for the final bit alone
(``scratchpad = false``), a small transformer learns parity far more slowly (measured in
docs/own_data.md; on scratchpads for parity, Anil et al. 2022, "Exploring Length
Generalization in Large Language Models").
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfmjax.data import Task, Vocab


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParityTask(Task):
    """Bit strings of ``min_len..max_len`` bits; the "length" split has ``max_len + 1`` to
    ``2 * max_len`` bits. The fields are the task's parameters (``data.task_params``)."""

    min_len: int = 1
    max_len: int = 12
    scratchpad: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(
                f"parity: need 1 <= min_len <= max_len, got min_len={self.min_len}, "
                f"max_len={self.max_len}"
            )
        # The task's own symbols; ids 0-4 are reserved (pad, bos, eos, sep, mask).
        object.__setattr__(self, "vocab", Vocab(["0", "1"]))

    def _generate(self, rng: np.random.Generator, long: bool) -> tuple[list[int], list[int]]:
        """One (source ids, target ids) pair, no BOS/EOS, drawn from ``rng`` only."""
        lo, hi = (self.max_len + 1, 2 * self.max_len) if long else (self.min_len, self.max_len)
        bits = rng.integers(0, 2, size=int(rng.integers(lo, hi + 1)))
        running = np.cumsum(bits) % 2
        answer = running if self.scratchpad else running[-1:]
        zero = self.vocab.token_id("0")
        return (bits + zero).tolist(), (answer + zero).tolist()

    def _max_lengths(self, long: bool) -> tuple[int, int]:
        """(longest source, longest target) either kind of example can have."""
        n = 2 * self.max_len if long else self.max_len
        return n, n if self.scratchpad else 1

    def canonical_input(self, text: str) -> str:
        """A person may type "1011" as well as "1 0 1 1"."""
        return text if " " in text.strip() else " ".join(text.strip())
