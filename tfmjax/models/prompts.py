"""Generation prompts on the host, before anything is traced: checking and layout.

Users give prompts as a list of id lists (each row's length is its own) or as a ``[B,P]``
int array, right-padded: its row lengths are given (``lengths``), or found from the model's
pad id (``model.pad_id``: a row ends where its padding starts), or, for a model without a
pad id, every row is ``P`` long. Any id of the vocabulary is a token, 0 included, unless it
is the model's pad id (:func:`read_prompts`).

Decoder-only prompts are turned into a **left-padded** batch, behind BOS when the model
prepends it (``model.prompt_bos``: the toy tasks; an imported Hugging Face model continues
exactly the ids it is given), of width ``P' = longest prompt (+ 1)``
(:func:`left_pad_decoder_prompts`)::

    row "5 6 7", width 5:   ids [0, BOS, 5, 6, 7]   segment_ids [0, 1, 1, 1, 1]
    row "5",     width 5:   ids [0, 0, 0, BOS, 5]   positions   [0, 0, 0, 0, 1]

Why left: every row's next token then goes to the same cache slot, and ALiBi / relative
position biases (and the sliding window), which measure distance in *slots*, see the true
distance between any two real tokens of a row. Positions (learned, sinusoidal, RoPE) are per
row and start at 0 at the first token, and padded slots have segment id 0 so nothing ever
attends to them: padding never changes another row's result, whatever id fills it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tfmjax.kernels.dispatch import same_choice_limit

FILL = 0  # what fills padded slots: any id will do, segment ids 0 hide them


class DecoderPrompt(NamedTuple):
    """A left-padded decoder-only prompt batch (int32 numpy arrays)."""

    ids: np.ndarray  # [B,P'] (BOS +) prompt, left-padded with FILL
    positions: np.ndarray  # [B,P'] 0 at the first token (and at padding)
    segment_ids: np.ndarray  # [B,P'] 1 = real token, 0 = padding
    lengths: np.ndarray  # [B]   prompt tokens per row (without BOS)


def _rows(prompts, what: str) -> list[list[int]]:
    rows = [list(r) if isinstance(r, (list, tuple, np.ndarray)) else None for r in prompts]
    if not rows or any(r is None for r in rows):
        raise ValueError(f"{what} must be a non-empty [B,P] int array or a list of id lists")
    for r in rows:
        for t in r:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise ValueError(f"{what} must hold int token ids, got {t!r}")
    return rows


def _checked_lengths(lengths, arr: np.ndarray, what: str) -> np.ndarray:
    lengths = np.asarray(lengths)
    if (
        lengths.shape != (arr.shape[0],)
        or not np.issubdtype(lengths.dtype, np.integer)
        or (lengths < 0).any()
        or (lengths > arr.shape[1]).any()
    ):
        raise ValueError(
            f"lengths of {what} must be [B={arr.shape[0]}] ints in [0, {arr.shape[1]}]; "
            f"got {lengths.tolist()}"
        )
    return lengths.astype(np.int32)


def read_prompts(
    prompts, vocab_size: int, what: str = "prompts", *, pad_id: int | None = 0, lengths=None
) -> tuple[np.ndarray, np.ndarray]:
    """Check ``prompts`` -> ``(ids [B,P] int32 right-padded, lengths [B] int32)``.

    A list of id lists: with a ``pad_id``, it is read as the array it pads to (a pad id
    before a token is refused); without one, each row is as long as its list. An array: its
    ``lengths`` if given, else the tokens before the padding (``pad_id``), else its width.
    """
    if isinstance(prompts, (list, tuple)):
        if lengths is not None:
            raise ValueError(f"lengths are for a [B,P] array of {what}; a list gives its own")
        rows = _rows(prompts, what)
        arr = np.full((len(rows), max(len(r) for r in rows)), FILL, np.int64)
        if pad_id is not None:
            arr[:] = pad_id
        for i, r in enumerate(rows):
            arr[i, : len(r)] = r
        if pad_id is None:
            lengths = np.array([len(r) for r in rows], np.int32)
    else:
        arr = np.asarray(prompts)
        if arr.ndim != 2 or arr.shape[0] == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"{what} must be a non-empty [B,P] int array or a list of id lists; "
                f"got shape {arr.shape} dtype {arr.dtype}"
            )
    if lengths is not None:
        lengths = _checked_lengths(lengths, arr, what)
        real = np.arange(arr.shape[1])[None, :] < lengths[:, None]
    elif pad_id is not None:
        real = arr != pad_id
        gap = ~real[:, :-1] & real[:, 1:]
        if gap.any():
            b, p = np.argwhere(gap)[0]
            raise ValueError(
                f"{what}[{b}] has padding ({pad_id}) at {p} before a token: pad on the right "
                f"only ({pad_id} is the model's pad id, model.pad_id)"
            )
        lengths = real.sum(axis=1).astype(np.int32)
    else:
        real = np.ones(arr.shape, bool)
        lengths = np.full((arr.shape[0],), arr.shape[1], np.int32)
    bad = real & ((arr < 0) | (arr >= vocab_size))
    if bad.any():
        b, p = np.argwhere(bad)[0]
        raise ValueError(
            f"{what}[{b}, {p}] = {arr[b, p]} is outside the vocabulary "
            f"[0, {vocab_size}) of this model"
        )
    arr = np.where(real, arr, FILL if pad_id is None else pad_id)
    return arr.astype(np.int32), lengths


def as_right_padded(prompts, vocab_size: int, what: str = "prompts", pad_id: int = 0):
    """:func:`read_prompts` of a model whose pad id is ``pad_id``: the ``[B,P]`` ids alone."""
    return read_prompts(prompts, vocab_size, what, pad_id=pad_id)[0]


def prompt_lengths(arr: np.ndarray, pad_id: int | None = 0) -> np.ndarray:
    """Real tokens per row of a right-padded array (pad id ``pad_id``; None: all). ``[B]``."""
    if pad_id is None:
        return np.full((arr.shape[0],), arr.shape[1], np.int32)
    return (arr != pad_id).sum(axis=1).astype(np.int32)


def segments_from_lengths(lengths: np.ndarray, width: int) -> np.ndarray:
    """Segment ids ``[B,width]`` of right-padded rows: 1 on each row's tokens, 0 after."""
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)


def bucket(width: int, cap: int) -> int:
    """The next power of two ``>= width``, at most ``cap`` (and never below ``width``): the
    width generation pads prompts to, so prompts of nearby lengths share one compiled program
    (a session's prompt lengths then compile about ``log2(max_len)`` programs at most). Nor
    past a length where ``attention_impl="auto"`` picks another kernel (on the CPU, the
    blockwise kernel from 512: a 300-token prompt pads to 511, not 512), so that padding
    never changes which kernel computes the prompt."""
    cap = min(cap, same_choice_limit(width))
    return max(width, min(1 << max(width - 1, 0).bit_length(), cap))


def left_pad_decoder_prompts(
    arr: np.ndarray, lengths: np.ndarray, bos_id: int | None, width: int | None = None
) -> DecoderPrompt:
    """Right-padded prompts ``[B,P]`` of ``lengths`` -> :class:`DecoderPrompt` of width
    ``P' = max length (+ 1 for BOS)``, or ``width`` if wider (more left padding: positions and
    slot distances of the tokens stay the same); ``bos_id`` None: no BOS, the prompts as they
    are."""
    lengths = np.asarray(lengths, np.int32)
    extra = 0 if bos_id is None else 1
    B, width = arr.shape[0], max(int(lengths.max()) + extra, width or 0)
    ids = np.full((B, width), FILL, np.int32)
    positions = np.zeros((B, width), np.int32)
    segment_ids = np.zeros((B, width), np.int32)
    for i, n in enumerate(lengths):
        start = width - extra - n
        if bos_id is not None:
            ids[i, start] = bos_id
        ids[i, start + extra :] = arr[i, :n]
        positions[i, start:] = np.arange(n + extra)
        segment_ids[i, start:] = 1
    return DecoderPrompt(ids, positions, segment_ids, lengths)
