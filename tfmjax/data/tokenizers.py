"""The :class:`Tokenizer` interface, and the text tokenizers: trained locally (characters, or
byte-level BPE with Hugging Face ``tokenizers``), and an imported Hugging Face model's own
(:class:`HFTokenizer`). A toy task's :class:`~tfmjax.data.vocab.Vocab` is a Tokenizer too.

Both keep the reserved ids of :mod:`tfmjax.data.vocab` (0 PAD, 1 BOS, 2 EOS, 3 SEP, 4 MASK)
and put their own tokens from id 5, so the models' ``bos_id`` and the EOS handling of
decoding work unchanged. ``to_dict()`` is plain JSON data: it travels inside every
checkpoint, and :func:`tokenizer_from_dict` rebuilds the tokenizer from it.

Why byte-level BPE from ``tokenizers`` (Sennrich et al. 2016; GPT-2's byte-level variant)
and not SentencePiece: its Rust trainer learns a vocabulary from the 4 MB corpus in about a
second, byte-level tokens round-trip any text exactly (SentencePiece rewrites spaces as
``▁`` and normalises text unless told not to), and the trained tokenizer serialises to one
JSON string that fits in the checkpoint's metadata.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from tfmjax.data.vocab import BOS_ID, EOS_ID, MASK_ID, PAD_ID, RESERVED_TOKENS

TOKENIZERS = ("char", "bpe")
MIN_BPE_VOCAB = len(RESERVED_TOKENS) + 256  # the reserved ids and the 256 byte tokens
_SHOWN = {EOS_ID: "\n", MASK_ID: "<mask>"}  # how decode() renders special ids (others: "")


@runtime_checkable
class Tokenizer(Protocol):
    """Text to ids and back, whatever the source: a toy task's vocabulary, a corpus's char or
    BPE tokenizer, an imported model's own. ``bos_id``, ``eos_id``, ``pad_id``: the source's
    special ids (None where it has none); ``size``: the number of ids."""

    bos_id: int | None
    eos_id: int | None
    pad_id: int | None

    @property
    def size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class _Reserved:
    """A corpus tokenizer: the reserved ids of :mod:`tfmjax.data.vocab`, its tokens from 5."""

    bos_id, eos_id, pad_id = BOS_ID, EOS_ID, PAD_ID

    def decode(self, ids: Iterable[int], *, stop_at_eos: bool = False) -> str:
        """Ids -> text. EOS shows as a newline (or ends the text with ``stop_at_eos``), MASK
        as ``<mask>``, an id past the tokenizer (a model vocabulary larger than it) as U+FFFD;
        PAD, BOS and SEP show as nothing."""
        out, run = [], []
        for i in (int(i) for i in ids):
            if not 0 <= i < self.size:
                out += [self._decode_run(run), "\ufffd"]
                run = []
                continue
            if i >= len(RESERVED_TOKENS):
                run.append(i)
                continue
            out.append(self._decode_run(run))
            run = []
            if i == EOS_ID and stop_at_eos:
                return "".join(out)
            out.append(_SHOWN.get(i, ""))
        out.append(self._decode_run(run))
        return "".join(out)


class CharTokenizer(_Reserved):
    """One id per character seen in the training text (``symbols``), from id 5."""

    kind = "char"

    def __init__(self, symbols: Sequence[str]):
        self.symbols = tuple(symbols)
        if any(len(s) != 1 for s in self.symbols) or len(set(self.symbols)) != len(self.symbols):
            raise ValueError("a char tokenizer's symbols must be distinct single characters")
        self._index = {ch: i + len(RESERVED_TOKENS) for i, ch in enumerate(self.symbols)}

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        return cls(sorted(set().union(*(set(t) for t in texts))))

    @property
    def size(self) -> int:
        return len(RESERVED_TOKENS) + len(self.symbols)

    def encode(self, text: str) -> list[int]:
        """Text -> ids (no BOS/EOS); ValueError naming the first character it never saw."""
        try:
            return [self._index[ch] for ch in text]
        except KeyError as err:
            raise ValueError(
                f"character {err.args[0]!r} is not in the tokenizer's {len(self.symbols)} "
                "characters (those of the training text)"
            ) from None

    def _decode_run(self, ids: list[int]) -> str:
        return "".join(self.symbols[i - len(RESERVED_TOKENS)] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "symbols": "".join(self.symbols)}


class BpeTokenizer(_Reserved):
    """Byte-level BPE: 256 byte tokens and learned merges, ``vocab_size`` ids in all."""

    kind = "bpe"

    def __init__(self, serialized: str):
        from tokenizers import Tokenizer

        self._serialized = serialized
        self._tok = Tokenizer.from_str(serialized)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size < MIN_BPE_VOCAB:
            raise ValueError(
                f"a byte-level BPE vocabulary needs at least {MIN_BPE_VOCAB} ids (5 reserved "
                f"+ 256 bytes), got vocab_size={vocab_size}"
            )
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(RESERVED_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(list(texts), trainer)
        return cls(tok.to_str())

    @property
    def size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def _decode_run(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "tokenizer": json.loads(self._serialized)}


class HFTokenizer:
    """An imported model's own tokenizer (a Hugging Face ``tokenizer.json``), with the model's
    special ids as its files name them (``bos_id``, ``eos_id``, ``pad_id``: None where there
    is none). No reserved ids: 0 is whatever token the vocabulary has there. ``encode`` adds
    the special tokens the tokenizer's post-processor adds (Llama's BOS, T5's EOS), as
    ``AutoTokenizer(text).input_ids`` does. ``files``: the other tokenizer files of the
    import (``tokenizer_config.json``, ``special_tokens_map.json``) as text, for export."""

    kind = "hf"

    def __init__(self, serialized: str, *, bos_id=None, eos_id=None, pad_id=None, files=None):
        from tokenizers import Tokenizer

        self.serialized = serialized  # the tokenizer.json text
        self._tok = Tokenizer.from_str(serialized)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.files = dict(files or {})

    @property
    def size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Iterable[int], *, stop_at_eos: bool = False) -> str:
        """Ids -> text, special tokens left out (as ``skip_special_tokens=True``); an id past
        the tokenizer shows as U+FFFD; ``stop_at_eos``: the text ends before ``eos_id``."""
        out, run = [], []
        for i in (int(i) for i in ids):
            if stop_at_eos and i == self.eos_id:
                break
            if 0 <= i < self.size:
                run.append(i)
                continue
            out += [self._tok.decode(run, skip_special_tokens=True), "\ufffd"]
            run = []
        return "".join([*out, self._tok.decode(run, skip_special_tokens=True)])

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def label(self, i: int) -> str:
        """How one id reads on its own (TransformerLens' ``to_str_tokens``); ``?i`` past it."""
        return self._tok.decode([i], skip_special_tokens=False) if 0 <= i < self.size else f"?{i}"

    def to_dict(self) -> dict:
        ids = {"bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id}
        return {
            "kind": self.kind,
            "tokenizer": json.loads(self.serialized),
            **ids,
            "files": self.files,
        }


def char_lengths(tokenizer: CharTokenizer | BpeTokenizer) -> np.ndarray:
    """``[V]`` characters each id stands for (EOS: 1, a separator; other reserved ids: 0),
    so bits per character can be compared across tokenizers."""
    lengths = np.zeros((tokenizer.size,), np.int64)
    for i in range(len(RESERVED_TOKENS), tokenizer.size):
        lengths[i] = len(tokenizer._decode_run([i]))
    lengths[EOS_ID] = 1
    return lengths


def train_tokenizer(
    kind: str, texts: Sequence[str], vocab_size: int | None = None
) -> CharTokenizer | BpeTokenizer:
    """A tokenizer of ``kind`` ("char" or "bpe") trained on ``texts``."""
    if kind == "char":
        return CharTokenizer.train(texts)
    if kind == "bpe":
        if vocab_size is None:
            raise ValueError("a bpe tokenizer needs vocab_size")
        return BpeTokenizer.train(texts, vocab_size)
    raise ValueError(f"unknown tokenizer {kind!r}; valid tokenizers: {', '.join(TOKENIZERS)}")


def tokenizer_from_dict(data: dict) -> Tokenizer:
    """Rebuild a tokenizer from its ``to_dict()``."""
    kind = data.get("kind")
    if kind == "char":
        return CharTokenizer(list(data["symbols"]))
    if kind == "bpe":
        return BpeTokenizer(json.dumps(data["tokenizer"]))
    if kind == "hf":
        ids = {k: data.get(k) for k in ("bos_id", "eos_id", "pad_id")}
        return HFTokenizer(json.dumps(data["tokenizer"]), **ids, files=data.get("files"))
    raise ValueError(f"unknown tokenizer kind {kind!r} in a saved tokenizer")
