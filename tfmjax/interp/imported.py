"""An imported Hugging Face model taken apart on a person's own text, as TransformerLens does.

An imported model (``python -m tfmjax.hf import``) has no task: ``python -m tfmjax.interp
WORKDIR patterns|dla --input "some text"`` (or ``--ids``) analyses that text, encoded with the
model's own tokenizer, and labels positions with its tokens; ``heads`` draws its repeated
random sequences from the whole vocabulary. :class:`UserText` stands where a task's data
source stands in :class:`tfmjax.interp.analyses.Run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tfmjax.data.tokenizers import Tokenizer

COMMANDS = ("heads", "patterns", "dla")  # what needs no task


class UserText:
    """One row of token ids as a causal LM's batch (``tokens``, every token a target)."""

    def __init__(self, ids: list[int], vocab_size: int, tokenizer=None):
        self.ids, self.vocab_size, self.tokenizer = list(ids), vocab_size, tokenizer

    def batch(self, *, batch_format: str, batch_size: int, seed: int, step: int, split: str):
        """The row (whatever the size asked for: the analyses average over rows)."""
        tokens = np.asarray([self.ids], np.int32)
        return {
            "tokens": tokens,
            "loss_mask": np.ones_like(tokens),
            "prompt_len": np.zeros((1,), np.int32),
        }

    def label(self, i: int) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.label(i)
        return str(i)


def user_ids(model, tokenizer: Tokenizer | None, text: str | None, ids: str | None) -> list[int]:
    """The ids to analyse: ``text`` through the model's tokenizer (its ``encode``, the
    :class:`~tfmjax.data.tokenizers.Tokenizer` interface) or ``ids`` as given, a leading BOS
    dropped (the decoder reads the model's BOS first itself). ValueError (one line)."""
    if text is not None:
        if tokenizer is None:
            raise ValueError(
                "--input needs the model's tokenizer (there was no tokenizer.json beside the "
                'weights at import): pass --ids "464 3290" instead'
            )
        found = tokenizer.encode(text)
    else:
        try:
            found = [int(t) for t in ids.split()]
        except ValueError:
            raise ValueError(f"--ids {ids!r} must be space-separated integers") from None
    if found and found[0] == model.config.bos_id:
        found = found[1:]
    if not found:
        raise ValueError('--input is empty: give the text to analyse, e.g. "Hello world"')
    return found


def open_user_text(model, tokenizer, command: str, text, ids) -> UserText:
    """The source of an imported model's run for ``command`` (ValueError, one line, for a
    command that needs a task or a model that is not a causal LM)."""
    vocab = model.config.vocab_size
    if command not in COMMANDS:
        raise ValueError(
            f"interp {command} needs a task; an imported model (no task) supports "
            f"{', '.join(COMMANDS)}: fine-tune it on a task first"
        )
    if text is None and ids is None:
        if command == "heads":
            return UserText([], vocab, tokenizer)
        raise ValueError(
            f'interp {command} on an imported model reads your text: pass --input "some text" '
            'or --ids "464 3290"'
        )
    if model.batch_format != "prompt_answer":
        raise ValueError(
            f"--input reads a causal language model's text; this is a {model.config.family} model"
        )
    return UserText(user_ids(model, tokenizer, text, ids), vocab, tokenizer)
