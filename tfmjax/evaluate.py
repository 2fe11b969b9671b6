"""Evaluation: teacher-forced loss and accuracy, greedy-decoded sequence exact-match.

``Evaluator(model_config, task, ...)(params) -> (metrics, rows)`` is what the training
loop calls every ``train.eval_every`` steps and what ``eval.py`` calls on a checkpoint.

Metrics (over exactly ``num_examples`` examples):
  loss, perplexity     teacher-forced NLL per target token (and exp of it)
  token_accuracy       teacher-forced argmax accuracy per target token
  exact_match          share of examples whose decode equals the target (incl. EOS)
Decoding is KV-cached :func:`tfmjax.decode.generate` with a strategy (greedy by default;
beam search or sampling from ``eval.py --decode``).
"""
from __future__ import annotations

import functools
from pathlib import Path
import math
import time

import jax
import numpy as np

from tfmjax.data import EOS_ID, PAD_ID, eval_batches, split_prompt_answer
from tfmjax.decode import Greedy, generate
from tfmjax.decode.prompts import check_lengths, prompt_lengths
from tfmjax.models import build
from tfmjax.models.checks import check_batch
from tfmjax.train.losses import cross_entropy, token_accuracy
from tfmjax.train.step import targets_and_mask

EVAL_SEED = 0  # the eval stream is the same for every run (train.seed changes only training)
NUM_ROWS = 5   # example rows kept for reports


def decode_prompts(batch: dict, family: str) -> np.ndarray:
    """What :func:`tfmjax.decode.generate` continues, ``[B,P]`` right-padded with 0.

    Encoder-decoder: the encoder inputs (``source EOS``). Decoder-only: each row's prompt
    ``source SEP`` (the first ``prompt_len`` tokens); the answer part is never read.
    """
    if family == "encoder_decoder":
        return np.asarray(batch["inputs"])
    tokens, prompt_len = np.asarray(batch["tokens"]), np.asarray(batch["prompt_len"])
    width = int(prompt_len.max())
    keep = np.arange(width)[None, :] < prompt_len[:, None]
    return np.where(keep, tokens[:, :width], PAD_ID).astype(np.int32)


def answer_targets(batch: dict, family: str, max_new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference answers aligned with generated tokens (answer, EOS, then PAD): ``(ids, mask)``,
    ``[B,M]``; ``mask`` marks the positions that must match."""
    if family == "encoder_decoder":
        targets = np.zeros((batch["targets"].shape[0], max_new_tokens), np.int32)
        width = min(max_new_tokens, batch["targets"].shape[1])
        targets[:, :width] = batch["targets"][:, :width]
        return targets, targets != PAD_ID
    tokens, mask, prompt_len = batch["tokens"], batch["loss_mask"], batch["prompt_len"]
    W = tokens.shape[1]
    idx = prompt_len[:, None] + np.arange(max_new_tokens)[None, :]
    inside = idx < W
    idx = np.minimum(idx, W - 1)
    targets = np.where(inside, np.take_along_axis(tokens, idx, axis=1), PAD_ID)
    return targets.astype(np.int32), inside & (np.take_along_axis(mask, idx, axis=1) > 0)


def row_sums(model, params, batch: dict, family: str) -> dict:
    """Teacher-forced per-row sums ``[B]``: nll, tokens, correct (so any prefix can be summed)."""
    logits = model.apply(params, batch)
    targets, mask = targets_and_mask(batch, family)

    def one(lg, tg, mk):
        nll, tokens = cross_entropy(lg[None], tg[None], mk[None])
        correct, _ = token_accuracy(lg[None], tg[None], mk[None])
        return {"nll": nll, "tokens": tokens, "correct": correct}
    return jax.vmap(one)(logits, targets, mask)


def ids_to_text(vocab, ids) -> str:
    """``vocab.decode``, but ids past the task vocabulary (model vocab is larger) show as ``?ID``."""
    words = []
    for i in (int(i) for i in ids):
        if i == EOS_ID:
            break
        words.append(vocab.decode([i]) if i < vocab.size else f"?{i}")
    return " ".join(w for w in words if w)


def decode_rows(task, batch: dict, predictions: np.ndarray, exact: np.ndarray, family: str,
                n: int) -> list[dict]:
    """The first ``n`` rows as text: input, prediction and target through the task vocab."""
    vocab, rows = task.vocab, []
    for i in range(min(n, predictions.shape[0])):
        if family == "encoder_decoder":
            source, target = batch["inputs"][i], batch["targets"][i]
        else:
            source, target = split_prompt_answer(batch["tokens"][i], int(batch["prompt_len"][i]))
        rows.append({"input": ids_to_text(vocab, source),
                     "prediction": ids_to_text(vocab, predictions[i]),
                     "target": ids_to_text(vocab, target), "correct": bool(exact[i])})
    return rows


class Evaluator:
    """Fixed eval batches of one split, the jitted teacher-forced sums and a decode strategy.

    ``strategy`` (default ``Greedy()``) decodes the answers; ``decode_seed`` seeds sampling
    strategies (batch ``i`` uses ``fold_in(key(decode_seed), i)``).
    """

    def __init__(self, model_config, task, *, batch_size: int, num_examples: int,
                 split: str = "eval", seed: int = EVAL_SEED, strategy=None, decode_seed: int = 0):
        self.family, self.task, self.split = model_config.family, task, split
        self.num_examples = num_examples
        self.strategy = Greedy() if strategy is None else strategy
        self.decode_key = jax.random.key(decode_seed)
        self.batches = eval_batches(task, family=self.family, batch_size=batch_size,
                                    num_examples=num_examples, seed=seed, split=split)
        self.max_new_tokens = task.max_target_len(split) + 1  # + EOS
        # Fixed per batch, so computed once: what is decoded and what it must equal.
        self.prompts = [decode_prompts(batch, self.family) for batch in self.batches]
        self.answers = [answer_targets(batch, self.family, self.max_new_tokens)
                        for batch in self.batches]
        for batch, prompts in zip(self.batches, self.prompts):
            check_batch(batch, model_config)
            check_lengths(model_config, prompt_lengths(prompts), self.max_new_tokens)
        self.model = build(model_config, deterministic=True)
        self._row_sums = jax.jit(functools.partial(row_sums, self.model, family=self.family))

    def __call__(self, params, num_rows: int = NUM_ROWS) -> tuple[dict, list[dict]]:
        start = time.perf_counter()
        sums = {"nll": 0.0, "tokens": 0.0, "correct": 0.0, "exact": 0}
        left, rows = self.num_examples, []
        for i, (batch, prompts) in enumerate(zip(self.batches, self.prompts)):
            n = min(left, len(prompts))
            per_row = jax.device_get(self._row_sums(params, batch))
            predictions = self.predict(params, prompts, jax.random.fold_in(self.decode_key, i))
            targets, mask = self.answers[i]
            exact = np.all((predictions == targets) | ~mask, axis=1)
            for key in ("nll", "tokens", "correct"):
                sums[key] += float(np.sum(per_row[key][:n], dtype=np.float64))
            sums["exact"] += int(exact[:n].sum())
            if len(rows) < num_rows:
                rows += decode_rows(self.task, batch, predictions, exact, self.family,
                                    min(n, num_rows - len(rows)))
            left -= n
        return self._metrics(sums, time.perf_counter() - start), rows

    def predict(self, params, prompts: np.ndarray, rng=None) -> np.ndarray:
        """Decoded answers ``[B, max_new_tokens]`` (tokens, EOS, then PAD) for ``prompts``
        from :func:`decode_prompts`."""
        out = generate(self.model, params, prompts, self.strategy, self.max_new_tokens, rng=rng)
        return np.asarray(out.tokens)

    def _metrics(self, sums: dict, seconds: float) -> dict:
        tokens = max(sums["tokens"], 1.0)
        loss = sums["nll"] / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 80.0)),
                "token_accuracy": sums["correct"] / tokens,
                "exact_match": sums["exact"] / self.num_examples,
                "num_examples": self.num_examples, "timing": {"eval_sec": seconds}}


# --------------------------------------------------------------------------- checkpoints

def _workdir_and_step(path: Path) -> tuple[Path, int | None]:
    """The workdir a checkpoint path belongs to, and the step if the path names one."""
    if path.name.isdigit() and path.parent.name == "checkpoints":
        return path.parent.parent, int(path.name)
    if path.name == "checkpoints":
        return path.parent, None
    return path, None


def _latest_step(workdir: Path) -> int | None:
    steps = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
    return max(steps) if steps else None


def evaluate_checkpoint(path: str | Path, *, split: str = "eval", num_examples: int | None = None,
                        batch_size: int | None = None, num_rows: int = NUM_ROWS,
                        strategy=None, decode_seed: int = 0) -> dict:
    """Evaluate the params of a checkpoint (a workdir, its ``checkpoints`` dir or a step dir).

    ``strategy`` decodes the answers (default ``Greedy()``; see :class:`Evaluator`).
    The config comes from the checkpoint. Raises CheckpointError (missing, corrupt) or
    ConfigError (a config, split or size that does not fit), each with a one-line message.
    """
    from tfmjax.config import ConfigError, from_dict
    from tfmjax.data import make_task
    from tfmjax.models.checks import InputError
    from tfmjax.train.checkpoint import load_for_inference

    path = Path(path)
    config, params = load_for_inference(path)
    experiment = from_dict(config)
    workdir, step = _workdir_and_step(path)
    data = experiment.data
    try:
        task = make_task(data.task, **data.task_params)
        evaluator = Evaluator(experiment.model, task, batch_size=batch_size or data.batch_size,
                              num_examples=num_examples or data.eval_examples, split=split,
                              strategy=strategy, decode_seed=decode_seed)
    except (ValueError, InputError) as err:
        raise ConfigError(str(err)) from None
    metrics, rows = evaluator(params, num_rows=num_rows)
    return {"checkpoint": str(path), "workdir": str(workdir),
            "step": step if step is not None else _latest_step(workdir),
            "experiment": experiment.name, "family": experiment.model.family, "task": data.task,
            "split": split, "decode": repr(evaluator.strategy), **metrics, "examples": rows}


def format_report(report: dict) -> str:
    """A printable table: the metrics, then a few input / prediction / target rows."""
    lines = [f"checkpoint      {report['checkpoint']} (step {report['step']})",
             f"model / task    {report['family']} / {report['task']}",
             f"split           {report['split']} ({report['num_examples']} examples)",
             f"decode          {report['decode']}"]
    for key in ("loss", "perplexity", "token_accuracy", "exact_match"):
        lines.append(f"{key:<15} {report[key]:.4f}")
    rows = report["examples"]
    if rows:
        width = {k: min(40, max(len(k), *(len(r[k]) for r in rows)))
                 for k in ("input", "prediction", "target")}
        header = "  ".join(f"{k:<{width[k]}}" for k in width)
        lines += ["", header + "  ok", "-" * (len(header) + 4)]
        for r in rows:
            cells = "  ".join(f"{r[k][:width[k]]:<{width[k]}}" for k in width)
            lines.append(f"{cells}  {'yes' if r['correct'] else 'NO'}")
    return "\n".join(lines)
