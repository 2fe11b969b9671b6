"""Token vocabulary shared by every toy task.

Ids 0..4 are reserved (PAD, BOS, EOS, SEP, MASK); task symbols follow from id 5.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
SEP_ID = 3
MASK_ID = 4

RESERVED_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<sep>", "<mask>")

_MAX_LISTED = 20  # how many valid symbols an error message lists before truncating


@dataclasses.dataclass(frozen=True)
class Vocab:
    """Reserved tokens followed by `symbols`; token id = index into `tokens`. A
    :class:`~tfmjax.data.tokenizers.Tokenizer`: ``encode``, ``decode``, the special ids, ``size``.

    `symbols` are the task symbols only (ids 5, 6, ...). A list is accepted and
    stored as a tuple so the vocab stays hashable.
    """

    symbols: tuple[str, ...]
    _index: dict[str, int] = dataclasses.field(init=False, repr=False, compare=False)
    bos_id, eos_id, pad_id = BOS_ID, EOS_ID, PAD_ID  # the Tokenizer interface's special ids

    def __post_init__(self) -> None:
        symbols = tuple(self.symbols)
        object.__setattr__(self, "symbols", symbols)
        tokens = RESERVED_TOKENS + symbols
        for tok in symbols:
            if not isinstance(tok, str) or not tok or tok.split() != [tok]:
                raise ValueError(
                    f"vocab symbols must be non-empty strings without whitespace, got {tok!r}"
                )
        index = {tok: i for i, tok in enumerate(tokens)}
        if len(index) != len(tokens):
            dupes = sorted({t for t in tokens if tokens.count(t) > 1})
            raise ValueError(
                f"duplicate vocab tokens (symbols may not repeat or reuse reserved names): {dupes}"
            )
        object.__setattr__(self, "_index", index)

    @property
    def tokens(self) -> tuple[str, ...]:
        """All tokens, reserved first: tokens[i] is the string of id i."""
        return RESERVED_TOKENS + self.symbols

    @property
    def size(self) -> int:
        """Number of ids (reserved + symbols); the model's embedding/logit width."""
        return len(RESERVED_TOKENS) + len(self.symbols)

    def __len__(self) -> int:
        return self.size

    def token_id(self, token: str) -> int:
        """Id of one token string; ValueError naming it and the valid ones if unknown."""
        try:
            return self._index[token]
        except KeyError:
            raise ValueError(
                f"unknown symbol {token!r}; valid symbols: {self._listing()}"
            ) from None

    def encode(self, text: str) -> list[int]:
        """Space-separated symbols -> ids (no BOS/EOS added). "" -> []."""
        return [self.token_id(tok) for tok in text.split()]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> space-separated symbols; stops at the first EOS, skips PAD and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            if not 0 <= i < self.size:
                raise ValueError(f"id {i} out of range for vocab of size {self.size}")
            out.append(self.tokens[i])
        return " ".join(out)

    def _listing(self) -> str:
        syms: Sequence[str] = self.symbols
        shown = ", ".join(syms[:_MAX_LISTED])
        if len(syms) > _MAX_LISTED:
            shown += f", ... (+{len(syms) - _MAX_LISTED} more)"
        return f"{shown} (reserved: {', '.join(RESERVED_TOKENS)})"
