"""Evaluation on a task: teacher-forced loss and accuracy, decoded sequence exact-match.

``Evaluator(model_config, task, ...)(params) -> (metrics, rows)`` is what the training
loop calls every ``train.eval_every`` steps and what :mod:`tfmjax.evaluation.report` (``eval.py``)
calls on a checkpoint. It asks the model family how to read a batch (targets and loss mask,
prompts, reference answers: :mod:`tfmjax.models.family`).

Metrics (over exactly ``num_examples`` examples):
  loss, perplexity     teacher-forced NLL per target token (and exp of it)
  token_accuracy       teacher-forced argmax accuracy per target token
  exact_match          share of examples whose decode equals the target (incl. EOS)
Decoding is KV-cached :func:`tfmjax.decode.generate` with a strategy (greedy by default;
beam search or sampling from ``eval.py --decode``).
"""

from __future__ import annotations

import functools
import math
import time

import jax
import numpy as np

from tfmjax.data import EOS_ID, PAD_ID, eval_batches
from tfmjax.decode import Greedy, generate
from tfmjax.decode.api import checked_prompts
from tfmjax.kernels import traced_with_trailing_padding
from tfmjax.losses import cross_entropy, token_accuracy
from tfmjax.models import build
from tfmjax.models.checks import auto_may_run_cudnn
from tfmjax.parallel.processes import to_host

EVAL_SEED = 0  # the eval stream is the same for every run (train.seed changes only training)
NUM_ROWS = 5  # example rows kept for reports


def row_sums(model, params, batch: dict) -> dict:
    """Teacher-forced per-row sums ``[B]``: nll, tokens, correct (so any prefix can be summed)."""
    logits = model.apply(params, batch)
    targets, mask = model.targets_and_mask(batch)

    def one(lg, tg, mk):
        nll, tokens = cross_entropy(lg[None], tg[None], mk[None])
        correct, _ = token_accuracy(lg[None], tg[None], mk[None])
        return {"nll": nll, "tokens": tokens, "correct": correct}

    return jax.vmap(one)(logits, targets, mask)


def teacher_forced_sums(model):
    """Jitted ``(params, batch) -> row_sums``; traced inside
    :func:`tfmjax.kernels.trailing_padding` where ``auto`` may run cuDNN (the evaluators
    check every batch for it)."""
    sums = functools.partial(row_sums, model)
    if auto_may_run_cudnn(model.config):
        sums = traced_with_trailing_padding(sums)
    return jax.jit(sums)


def ids_to_text(vocab, ids) -> str:
    """``vocab.decode``, but ids past the task vocabulary (a larger model vocab) show as ``?ID``."""
    words = []
    for i in (int(i) for i in ids):
        if i == EOS_ID:
            break
        words.append(vocab.decode([i]) if i < vocab.size else f"?{i}")
    return " ".join(w for w in words if w)


def decode_rows(
    model, task, batch: dict, predictions: np.ndarray, exact: np.ndarray, n: int
) -> list[dict]:
    """The first ``n`` rows as text: input, prediction and target through the task vocab."""
    vocab, rows = task.vocab, []
    for i in range(min(n, predictions.shape[0])):
        source, target = model.source_and_target(batch, i)
        rows.append(
            {
                "input": ids_to_text(vocab, source),
                "prediction": ids_to_text(vocab, predictions[i]),
                "target": ids_to_text(vocab, target),
                "correct": bool(exact[i]),
            }
        )
    return rows


class Evaluator:
    """Fixed eval batches of one split, the jitted teacher-forced sums and a decode strategy.

    ``strategy`` (default ``Greedy()``) decodes the answers; ``decode_seed`` seeds sampling
    strategies (batch ``i`` uses ``fold_in(key(decode_seed), i)``).
    """

    metric_names = ("loss", "perplexity", "token_accuracy", "exact_match")

    def __init__(
        self,
        model_config,
        task,
        *,
        batch_size: int,
        num_examples: int,
        split: str = "eval",
        seed: int = EVAL_SEED,
        strategy=None,
        decode_seed: int = 0,
    ):
        self.model = model = build(model_config, deterministic=True)
        model.check_task_padding(PAD_ID)  # the task batches pad with the toy vocabulary's 0
        self.task, self.split = task, split
        self.num_examples = num_examples
        self.strategy = Greedy() if strategy is None else strategy
        self.decode_key = jax.random.key(decode_seed)
        self.batches = eval_batches(
            task,
            batch_format=model.batch_format,
            batch_size=batch_size,
            num_examples=num_examples,
            seed=seed,
            split=split,
        )
        self.max_new_tokens = task.max_target_len(split) + 1  # + EOS
        # Fixed per batch, so computed once: what is decoded and what it must equal.
        self.prompts = [model.eval_prompts(batch) for batch in self.batches]
        self.answers = [model.eval_answers(batch, self.max_new_tokens) for batch in self.batches]
        for batch, prompts in zip(self.batches, self.prompts, strict=True):
            model.check_batch(batch, auto_may_run_cudnn(model_config))
            checked_prompts(model, prompts, self.max_new_tokens)
        self._row_sums = teacher_forced_sums(model)

    def __call__(self, params, num_rows: int = NUM_ROWS) -> tuple[dict, list[dict]]:
        start = time.perf_counter()
        sums = {"nll": 0.0, "tokens": 0.0, "correct": 0.0, "exact": 0}
        left, rows = self.num_examples, []
        for i, (batch, prompts) in enumerate(zip(self.batches, self.prompts, strict=True)):
            n = min(left, len(prompts))
            per_row = to_host(self._row_sums(params, batch))
            predictions = self.predict(params, prompts, jax.random.fold_in(self.decode_key, i))
            targets, mask = self.answers[i]
            exact = np.all((predictions == targets) | ~mask, axis=1)
            for key in ("nll", "tokens", "correct"):
                sums[key] += float(np.sum(per_row[key][:n], dtype=np.float64))
            sums["exact"] += int(exact[:n].sum())
            if len(rows) < num_rows:
                rows += decode_rows(
                    self.model, self.task, batch, predictions, exact, min(n, num_rows - len(rows))
                )
            left -= n
        return self._metrics(sums, time.perf_counter() - start), rows

    def predict(self, params, prompts, rng=None) -> np.ndarray:
        """Decoded answers ``[B,M]`` (tokens, EOS, then PAD) for ``prompts`` from
        ``model.eval_prompts``."""
        out = generate(self.model, params, prompts, self.strategy, self.max_new_tokens, rng=rng)
        return to_host(out.tokens)

    def _metrics(self, sums: dict, seconds: float) -> dict:
        tokens = max(sums["tokens"], 1.0)
        loss = sums["nll"] / tokens
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 80.0)),
            "token_accuracy": sums["correct"] / tokens,
            "exact_match": sums["exact"] / self.num_examples,
            "num_examples": self.num_examples,
            "timing": {"eval_sec": seconds},
        }
