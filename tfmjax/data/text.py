"""Language modelling on real text: token files of a corpus and random windows from them.

``TextSource(name, task_params)`` reads the corpus (:mod:`tfmjax.data.corpus`): the plays of
``"shakespeare"``, or your own file of ``"text:PATH"`` as one document. It splits every
document 90/10 into training and validation text at a line boundary (contiguous chunks, so
no line is in both), trains the tokenizer on the training text only, and tokenizes each
split once into a NumPy file (documents joined by EOS). Both are cached under
``$TFMJAX_CACHE_DIR/text/<key>/`` (default ``~/.cache/tfmjax``), the key being a hash of
the cleaned corpus (its text, not its path), the tokenizer settings and this file format,
so a second run (or a resume) reads them back in milliseconds.

Batches are a pure function of ``(seed, step, split)``, like the toy tasks' (bit-exact
resume): ``B`` windows of ``context`` tokens at random offsets.
  ``prompt_answer`` (decoder-only LM): tokens ``[B,T]``, loss_mask ones, prompt_len zeros;
                    the model predicts every token of the window from BOS and those before.
  ``masked_lm``     (encoder-only, BERT's recipe; Devlin et al. 2019): each position is
                    picked with probability ``mask_rate``; a picked token becomes MASK
                    (80%), a random non-reserved token (10%) or stays (10%).
                    tokens ``[B,T]`` (corrupted), targets ``[B,T]`` (original), loss_mask
                    ``[B,T]`` (1.0 on picked positions).
Splits: "train" and "eval" (the validation text).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tfmjax.config.task_spec import TEXT_PREFIX
from tfmjax.data.base import parse_params
from tfmjax.data.corpus import load_plays, read_text_file
from tfmjax.data.tokenizers import (
    TOKENIZERS,
    CharTokenizer,
    Tokenizer,
    char_lengths,
    tokenizer_from_dict,
    train_tokenizer,
)
from tfmjax.data.user_data import text_file
from tfmjax.data.vocab import EOS_ID, MASK_ID, RESERVED_TOKENS

CORPORA = ("shakespeare",)  # built-in corpora; "text:PATH" is your own
TEXT_SPLITS = ("train", "eval")
TEXT_FORMATS = ("prompt_answer", "masked_lm")
TRAIN_FRACTION = 0.9
FILE_FORMAT = 1  # bump when the cleaning, split or file layout changes
_SPLIT_CODES = {"train": 0, "eval": 1}


def cache_root() -> Path:
    """Where token files are cached: ``$TFMJAX_CACHE_DIR`` or ``~/.cache/tfmjax``."""
    return Path(os.environ.get("TFMJAX_CACHE_DIR") or Path.home() / ".cache" / "tfmjax")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextParams:
    """``data.task_params`` of a text task (each checked with a one-line ValueError)."""

    tokenizer: str = "char"
    vocab_size: int = 1024  # bpe only
    context: int = 64  # tokens per window
    mask_rate: float = 0.15  # masked_lm only
    samples: int = 3  # sampled continuations per evaluation (decoder-only)
    sample_tokens: int = 200
    temperature: float = 0.8
    top_k: int = 40

    def __post_init__(self):
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(
                f"tokenizer={self.tokenizer!r} is invalid: must be one of {', '.join(TOKENIZERS)}"
            )
        for name, lo in (("vocab_size", 1), ("context", 1), ("samples", 0), ("top_k", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name}={value!r} is invalid: must be an int >= {lo}")
        if self.sample_tokens < 1:
            raise ValueError(f"sample_tokens={self.sample_tokens!r} is invalid: must be >= 1")
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"mask_rate={self.mask_rate!r} is invalid: must be in (0, 1)")
        if not self.temperature > 0.0:
            raise ValueError(f"temperature={self.temperature!r} is invalid: must be > 0")

    @classmethod
    def parse(cls, params: dict[str, Any]) -> TextParams:
        return parse_params(cls, params, "a text task")


def split_play(text: str) -> tuple[str, str]:
    """``(training part, validation part)``: the first 90% of a document and the rest, cut
    at the line boundary before the 90% mark (at the mark itself if no line ends before it)."""
    mark = int(len(text) * TRAIN_FRACTION)
    cut = text.rfind("\n", 0, mark) + 1 or mark
    return text[:cut], text[cut:]


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _write_atomically(directory: Path, files: dict[str, Any]) -> None:
    """Write ``files`` ({name: ndarray or JSON data}) into ``directory`` as one rename, so
    a reader never sees half of them (two processes building it at once both succeed)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        for name, value in files.items():
            if isinstance(value, np.ndarray):
                np.save(tmp / name, value)
            else:
                (tmp / name).write_text(json.dumps(value))
        try:
            os.replace(tmp, directory)
        except OSError:  # another process made it first
            if not directory.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _encode_split(tokenizer: Tokenizer, parts: list[str]) -> np.ndarray:
    """Every play's part, tokenized, each followed by EOS, as one uint16/int32 array."""
    ids: list[int] = []
    for part in parts:
        ids += tokenizer.encode(part) + [EOS_ID]
    dtype = np.uint16 if tokenizer.size <= 2**16 else np.int32
    return np.asarray(ids, dtype)


class TextSource:
    """A corpus tokenized into train/eval token arrays, served as fixed-shape windows.

    ``tokenizer``: use this one (e.g. restored from a checkpoint) instead of training one;
    ``origin``: where a checkpoint's ``"text:PATH"`` file was (its ``task_origin`` asset).
    """

    digit_ids: tuple[int, ...] = ()  # a corpus has no digit tokens to give Abacus places
    batch_formats = TEXT_FORMATS

    def __init__(
        self,
        name: str,
        params: dict[str, Any],
        *,
        tokenizer: Tokenizer | None = None,
        origin: dict | None = None,
    ):
        self.name = name
        self.params = TextParams.parse(params)
        self.origin = None  # where "text:PATH" was found
        if name.startswith(TEXT_PREFIX):
            path, self.origin = text_file(name, origin)
            documents, kind = read_text_file(path), "text"
        elif name in CORPORA:
            documents, kind = load_plays(), name
        else:
            raise ValueError(f"unknown corpus {name!r}; corpora: {', '.join(CORPORA)}, text:PATH")
        parts = [split_play(text) for _, text in documents]
        corpus_key = _digest(FILE_FORMAT, kind, [text for _, text in documents])
        if tokenizer is None:
            tokenizer = self._trained_tokenizer(corpus_key, parts)
        self.tokenizer = tokenizer
        self.ids = self._token_files(corpus_key, parts)
        self.char_lengths = char_lengths(tokenizer)
        self.num_chars = {
            "train": sum(len(p[0]) for p in parts),
            "eval": sum(len(p[1]) for p in parts),
        }
        for split in TEXT_SPLITS:
            if len(self.ids[split]) <= self.params.context:
                raise ValueError(
                    f"the {split} text has {len(self.ids[split])} tokens, not more than "
                    f"context={self.params.context}: give a longer text or a smaller "
                    "data.task_params.context"
                )

    def _trained_tokenizer(self, corpus_key: str, parts: list[tuple[str, str]]) -> Tokenizer:
        """Trained on the training parts; a char tokenizer gives the characters met only in
        the validation parts ids after those (never trained, so the model scores them as
        the unseen characters they are; Shakespeare has none)."""
        p = self.params
        vocab = p.vocab_size if p.tokenizer == "bpe" else None
        version = _tokenizers_version() if p.tokenizer == "bpe" else ""
        directory = (
            cache_root() / "text" / f"tokenizer-{_digest(corpus_key, p.tokenizer, vocab, version)}"
        )
        path = directory / "tokenizer.json"
        if not path.is_file():
            trained = train_tokenizer(p.tokenizer, [part[0] for part in parts], vocab)
            if isinstance(trained, CharTokenizer):
                unseen = set().union(*(part[1] for part in parts)) - set(trained.symbols)
                trained = CharTokenizer(trained.symbols + tuple(sorted(unseen)))
            _write_atomically(directory, {"tokenizer.json": trained.to_dict()})
        return tokenizer_from_dict(json.loads(path.read_text()))

    def _token_files(self, corpus_key: str, parts: list[tuple[str, str]]) -> dict[str, np.ndarray]:
        directory = (
            cache_root() / "text" / f"tokens-{_digest(corpus_key, self.tokenizer.to_dict())}"
        )
        if not all((directory / f"{split}.npy").is_file() for split in TEXT_SPLITS):
            arrays = {
                f"{split}.npy": _encode_split(self.tokenizer, [p[i] for p in parts])
                for i, split in enumerate(TEXT_SPLITS)
            }
            _write_atomically(directory, arrays)
        return {split: np.load(directory / f"{split}.npy") for split in TEXT_SPLITS}

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer uses; the model's ``vocab_size`` must be at least this."""
        return self.tokenizer.size

    def check_split(self, split: str) -> None:
        if split not in TEXT_SPLITS:
            raise ValueError(
                f"a text task has splits {', '.join(TEXT_SPLITS)}, not {split!r} (the length "
                "split exists for toy tasks only)"
            )

    def windows(
        self, *, batch_size: int, seed: int, step: int, split: str, rows: slice | None = None
    ) -> np.ndarray:
        """``[B, context]`` int32 windows at random offsets: a pure function of the arguments
        (``rows``: only those rows, cut from the same offsets)."""
        self.check_split(split)
        ids, T = self.ids[split], self.params.context
        rng = np.random.default_rng([int(seed), int(step), _SPLIT_CODES[split]])
        starts = rng.integers(0, len(ids) - T + 1, size=batch_size)
        if rows is not None:
            starts = starts[rows]
        return ids[starts[:, None] + np.arange(T)[None, :]].astype(np.int32)

    def batch(
        self,
        *,
        batch_format: str,
        batch_size: int,
        seed: int,
        step: int,
        split: str = "train",
        rows: slice | None = None,
    ) -> dict[str, np.ndarray]:
        """Batch ``step`` of stream ``seed`` in ``batch_format`` (see the module docstring);
        ``rows``: only those rows of it (a process's share), equal to the whole batch's."""
        if batch_format not in TEXT_FORMATS:
            raise ValueError(
                f"a text task serves {', '.join(TEXT_FORMATS)} batches, not {batch_format!r}"
            )
        tokens = self.windows(batch_size=batch_size, seed=seed, step=step, split=split, rows=rows)
        if batch_format == "prompt_answer":
            return {
                "tokens": tokens,
                "loss_mask": np.ones(tokens.shape, np.float32),
                "prompt_len": np.zeros((len(tokens),), np.int32),
            }
        rng = np.random.default_rng([int(seed), int(step), _SPLIT_CODES[split], 1])
        whole = (batch_size, tokens.shape[1])
        return mask_tokens(tokens, rng, self.params.mask_rate, self.vocab_size, whole, rows)

    def eval_batches(self, *, batch_size: int, num_examples: int, seed: int, split: str):
        """A fixed list of ``ceil(num_examples / batch_size)`` batches of windows of ``split``."""
        return [
            self.windows(batch_size=batch_size, seed=seed, step=step, split=split)
            for step in range(-(-num_examples // batch_size))
        ]

    def assets(self) -> dict:
        """What a checkpoint must carry to read and write text: the tokenizer (and where
        ``"text:PATH"`` was found)."""
        origin = {"task_origin": self.origin} if self.origin else {}
        return {"tokenizer": self.tokenizer.to_dict(), **origin}


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    mask_rate: float,
    vocab_size: int,
    whole: tuple[int, int] | None = None,
    rows: slice | None = None,
) -> dict[str, np.ndarray]:
    """BERT's masking of ``tokens [B,T]``: picked with probability ``mask_rate``, then
    80% MASK, 10% a random non-reserved id, 10% unchanged. ``tokens`` may be ``rows`` of a
    batch shaped ``whole``: the draws are the whole batch's, cut to those rows."""
    shape, rows = (tokens.shape, slice(None)) if whole is None else (whole, rows or slice(None))
    picked = (rng.random(shape) < mask_rate)[rows]
    choice = rng.random(shape)[rows]
    random_ids = rng.integers(len(RESERVED_TOKENS), vocab_size, size=shape)[rows]
    corrupted = np.where(picked & (choice < 0.8), MASK_ID, tokens)
    corrupted = np.where(picked & (choice >= 0.8) & (choice < 0.9), random_ids, corrupted)
    return {
        "tokens": corrupted.astype(np.int32),
        "targets": tokens.astype(np.int32),
        "loss_mask": picked.astype(np.float32),
    }


def _tokenizers_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("tokenizers")
