"""Deterministic, fixed-shape batches: a batch is a pure function of (task, seed, step, split).

Batch formats (B = batch_size, S/T = widths from `batch_widths`, fixed per task and split);
a model family names the one it trains on (``model.batch_format``):
  "seq2seq":         inputs  int32 [B, S] = source + EOS, then PAD (0);
                     targets int32 [B, T] = target + EOS, then PAD.
                     (encoder-decoder: the model prepends BOS to targets itself.)
  "prompt_answer":   tokens     int32   [B, T] = source + SEP + target + EOS, then PAD;
                     loss_mask  float32 [B, T] = 1.0 on target tokens and that EOS only;
                     prompt_len int32   [B]    = len(source) + 1 (prompt incl. SEP).
                     (decoder-only: the model predicts tokens[:, t] from BOS + tokens[:, :t].)
Widths depend only on (task, split); "train" and "eval" share them, so switching
between them never triggers a recompile.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from tfmjax.data.base import SPLITS, Example, Task
from tfmjax.data.vocab import EOS_ID, PAD_ID, SEP_ID

BATCH_FORMATS: tuple[str, ...] = ("seq2seq", "prompt_answer")
_SPLIT_CODES = {name: i for i, name in enumerate(SPLITS)}  # train 0, eval 1, length 2

Batch = dict[str, np.ndarray]


def _check_format(batch_format: str | None) -> None:
    if batch_format not in BATCH_FORMATS:
        raise ValueError(
            f"unknown batch format {batch_format!r} (valid formats: "
            f"{', '.join(BATCH_FORMATS)}); a model family without a format cannot "
            "train on toy tasks"
        )


def _check_int_arg(name: str, value: int, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")


def batch_widths(task: Task, *, batch_format: str, split: str = "train") -> dict[str, int]:
    """Padded sequence widths per batch key, e.g. {"inputs": S, "targets": T}."""
    _check_format(batch_format)
    src, tgt = task.max_source_len(split) + 1, task.max_target_len(split) + 1  # + EOS / + SEP
    if batch_format == "seq2seq":
        return {"inputs": src, "targets": tgt}
    return {"tokens": src + tgt}


def collate(
    task: Task, examples: Sequence[Example], *, batch_format: str, split: str = "train"
) -> Batch:
    """(source, target) pairs -> padded numpy batch of `batch_format` (see module docstring)."""
    widths = batch_widths(task, batch_format=batch_format, split=split)
    b = len(examples)
    max_src, max_tgt = task.max_source_len(split), task.max_target_len(split)
    for source, target in examples:
        if len(source) > max_src or len(target) > max_tgt:
            raise ValueError(
                f"task {task.name!r}: example ({len(source)}, {len(target)}) tokens exceeds "
                f"declared max lengths for split {split!r}"
            )
    if batch_format == "seq2seq":
        inputs = np.full((b, widths["inputs"]), PAD_ID, np.int32)
        targets = np.full((b, widths["targets"]), PAD_ID, np.int32)
        for i, (source, target) in enumerate(examples):
            inputs[i, : len(source) + 1] = source + [EOS_ID]
            targets[i, : len(target) + 1] = target + [EOS_ID]
        return {"inputs": inputs, "targets": targets}
    tokens = np.full((b, widths["tokens"]), PAD_ID, np.int32)
    loss_mask = np.zeros((b, widths["tokens"]), np.float32)
    prompt_len = np.zeros((b,), np.int32)
    for i, (source, target) in enumerate(examples):
        p, n = len(source) + 1, len(source) + len(target) + 2
        tokens[i, :n] = source + [SEP_ID] + target + [EOS_ID]
        loss_mask[i, p:n] = 1.0
        prompt_len[i] = p
    return {"tokens": tokens, "loss_mask": loss_mask, "prompt_len": prompt_len}


def make_batch(
    task: Task,
    *,
    batch_format: str,
    batch_size: int,
    seed: int,
    step: int,
    split: str = "train",
    rows: slice | None = None,
) -> Batch:
    """Batch number `step` of the stream `seed`: same args -> identical arrays, no global state.

    `rows`: only those rows of it (a process's share of a global batch); every example is
    still drawn, in order, so the rows are the whole batch's, but only they are collated."""
    _check_format(batch_format)
    task.check_split(split)
    _check_int_arg("batch_size", batch_size, 1)
    _check_int_arg("seed", seed, 0)
    _check_int_arg("step", step, 0)
    rng = np.random.default_rng([int(seed), int(step), _SPLIT_CODES[split]])
    examples = [task.sample(rng, split) for _ in range(batch_size)]
    if rows is not None:
        examples = examples[rows]
    return collate(task, examples, batch_format=batch_format, split=split)


def iterate_batches(
    task: Task,
    *,
    batch_format: str,
    batch_size: int,
    seed: int,
    start_step: int = 0,
    split: str = "train",
) -> Iterator[Batch]:
    """Endless make_batch(step) for step = start_step, start_step + 1, ... (resumable)."""
    step = start_step
    while True:
        yield make_batch(
            task,
            batch_format=batch_format,
            batch_size=batch_size,
            seed=seed,
            step=step,
            split=split,
        )
        step += 1


def eval_batches(
    task: Task,
    *,
    batch_format: str,
    batch_size: int,
    num_examples: int,
    seed: int = 0,
    split: str = "eval",
) -> list[Batch]:
    """A fixed list of ceil(num_examples / batch_size) full batches (num_examples rounds up,
    so every batch has shape [batch_size, ...] and no example mask is needed)."""
    _check_int_arg("batch_size", batch_size, 1)
    _check_int_arg("num_examples", num_examples, 1)
    n = -(-num_examples // batch_size)
    return [
        make_batch(
            task,
            batch_format=batch_format,
            batch_size=batch_size,
            seed=seed,
            step=step,
            split=split,
        )
        for step in range(n)
    ]


def split_prompt_answer(
    tokens: Sequence[int] | np.ndarray, prompt_len: int
) -> tuple[list[int], list[int]]:
    """One prompt_answer row -> (source ids, answer ids): drops SEP, stops before EOS/PAD."""
    row = [int(t) for t in tokens]
    answer = []
    for t in row[prompt_len:]:
        if t in (EOS_ID, PAD_ID):
            break
        answer.append(t)
    return row[: max(prompt_len - 1, 0)], answer
