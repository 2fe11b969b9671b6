"""Perplexity of a causal language model on a person's text (``eval.py WORKDIR --text FILE``).

The text is encoded with the model's own tokenizer, cut into windows of ``model.max_len``
tokens, and each window is scored teacher-forced behind the model's BOS (the family shifts
right itself), so every token of the text is scored once; a BOS the tokenizer puts first
(Llama's) is that BOS and is not scored. Windows do not overlap: each starts afresh, the
strided evaluation of the transformers perplexity guide with stride = window (a lower bound
on the context, so a higher perplexity than a sliding window would give).

Metrics: ``loss`` (mean NLL per token, nats), ``perplexity`` (its exp), ``bits_per_char``
(total NLL / ln 2 / characters of the text: comparable across tokenizers), ``tokens``.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

from tfmjax.evaluation.evaluator import row_sums
from tfmjax.models import build
from tfmjax.parallel.processes import to_host


def text_windows(ids: list[int], width: int, bos_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` (a leading ``bos_id`` dropped) in rows of ``width``: ``(tokens [W,T], real
    [W,T])``, the last row padded (``real`` 0 there) with its own last id."""
    if bos_id is not None and ids and ids[0] == bos_id:
        ids = ids[1:]
    if not ids:
        raise ValueError("the text holds no token to score: give a longer text")
    rows = -(-len(ids) // width)
    tokens = np.full((rows * width,), ids[-1], np.int32)
    real = np.zeros((rows * width,), np.int32)
    tokens[: len(ids)], real[: len(ids)] = ids, 1
    return tokens.reshape(rows, width), real.reshape(rows, width)


def text_perplexity(model_config, params, ids: list[int], chars: int, batch_size: int) -> dict:
    """Score ``ids`` (a text of ``chars`` characters, encoded) with a causal LM: the metrics
    above and ``num_examples`` (windows)."""
    model = build(model_config, deterministic=True)
    if model.batch_format != "prompt_answer":
        raise ValueError(
            f"--text scores a causal language model; model.family={model_config.family!r} "
            "is not one (fine-tune it on a task and evaluate that)"
        )
    tokens, real = text_windows(ids, model_config.max_len, model_config.bos_id)
    sums = jax.jit(functools.partial(row_sums, model))
    nll = count = 0.0
    for start in range(0, tokens.shape[0], batch_size):
        batch = {
            "tokens": tokens[start : start + batch_size],
            "loss_mask": real[start : start + batch_size],
            "segment_ids": real[start : start + batch_size],  # padding attends to nothing
        }
        out = to_host(sums(params, batch))
        nll += float(np.sum(out["nll"]))
        count += float(np.sum(out["tokens"]))
    loss = nll / count
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_char": nll / math.log(2) / max(chars, 1),
        "tokens": int(count),
        "num_examples": int(tokens.shape[0]),
    }
