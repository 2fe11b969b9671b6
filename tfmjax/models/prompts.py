"""Generation prompts on the host, before anything is traced: checking and layout.

Users give prompts right-padded with 0 (``[B,P]`` int array) or as a list of id lists
(:func:`as_right_padded`). Decoder-only prompts are turned into a **left-padded** batch behind
BOS of width ``P' = longest prompt + 1`` (:func:`left_pad_decoder_prompts`)::

    row "5 6 7", width 5:   ids [0, BOS, 5, 6, 7]   segment_ids [0, 1, 1, 1, 1]
    row "5",     width 5:   ids [0, 0, 0, BOS, 5]   positions   [0, 0, 0, 0, 1]

Why left: every row's next token then goes to the same cache slot, and ALiBi / relative
position biases (and the sliding window), which measure distance in *slots*, see the true
distance between any two real tokens of a row. Positions (learned, sinusoidal, RoPE) are per
row and start at 0 at BOS, and padded slots have segment id 0 so nothing ever attends to
them: padding never changes another row's result.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class DecoderPrompt(NamedTuple):
    """A left-padded decoder-only prompt batch (int32 numpy arrays)."""

    ids: np.ndarray  # [B,P'] BOS + prompt, left-padded with 0
    positions: np.ndarray  # [B,P'] 0 at BOS (and at padding)
    segment_ids: np.ndarray  # [B,P'] 1 = real token, 0 = padding
    lengths: np.ndarray  # [B]   prompt tokens per row (without BOS)


def as_right_padded(prompts, vocab_size: int, what: str = "prompts") -> np.ndarray:
    """Check ``prompts`` ([B,P] array or list of id lists) -> int32 ``[B,P]``, 0 on the right."""
    if isinstance(prompts, (list, tuple)):
        rows = [list(r) if isinstance(r, (list, tuple, np.ndarray)) else None for r in prompts]
        if not rows or any(r is None for r in rows):
            raise ValueError(f"{what} must be a non-empty [B,P] int array or a list of id lists")
        for r in rows:
            for t in r:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise ValueError(f"{what} must hold int token ids, got {t!r}")
        width = max(len(r) for r in rows)
        arr = np.zeros((len(rows), width), np.int64)
        for i, r in enumerate(rows):
            arr[i, : len(r)] = r
    else:
        arr = np.asarray(prompts)
        if arr.ndim != 2 or arr.shape[0] == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"{what} must be a non-empty [B,P] int array or a list of id lists; "
                f"got shape {arr.shape} dtype {arr.dtype}"
            )
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        b, p = np.argwhere(bad)[0]
        raise ValueError(
            f"{what}[{b}, {p}] = {arr[b, p]} is outside the vocabulary "
            f"[0, {vocab_size}) of this model"
        )
    real = arr != 0
    gap = ~real[:, :-1] & real[:, 1:]
    if gap.any():
        b, p = np.argwhere(gap)[0]
        raise ValueError(
            f"{what}[{b}] has padding (0) at {p} before a token: pad on the right "
            "only (0 is the PAD id)"
        )
    return arr.astype(np.int32)


def prompt_lengths(arr: np.ndarray) -> np.ndarray:
    """Real tokens per row of a right-padded array. ``[B]`` int32."""
    return (arr != 0).sum(axis=1).astype(np.int32)


def left_pad_decoder_prompts(arr: np.ndarray, bos_id: int) -> DecoderPrompt:
    """Right-padded prompts ``[B,P]`` -> :class:`DecoderPrompt` of width ``P' = max length + 1``."""
    lengths = prompt_lengths(arr)
    B, width = arr.shape[0], int(lengths.max()) + 1
    ids = np.zeros((B, width), np.int32)
    positions = np.zeros((B, width), np.int32)
    segment_ids = np.zeros((B, width), np.int32)
    for i, n in enumerate(lengths):
        start = width - 1 - n
        ids[i, start] = bos_id
        ids[i, start + 1 :] = arr[i, :n]
        positions[i, start:] = np.arange(n + 1)
        segment_ids[i, start:] = 1
    return DecoderPrompt(ids, positions, segment_ids, lengths)
