"""Evaluation: teacher-forced loss and accuracy, greedy-decoded sequence exact-match.

``Evaluator(model_config, task, ...)(params) -> (metrics, rows)`` is what the training
loop calls every ``train.eval_every`` steps and what ``eval.py`` calls on a checkpoint.

Metrics (over exactly ``num_examples`` examples):
  loss, perplexity     teacher-forced NLL per target token (and exp of it)
  token_accuracy       teacher-forced argmax accuracy per target token
  exact_match          share of examples whose greedy decode equals the target (incl. EOS)
Decoding is an uncached greedy loop (:func:`greedy_predict`), one full forward pass per
new token; it is the obviously-correct twin the KV-cached decoder must agree with.
"""
from __future__ import annotations

import functools
from pathlib import Path
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.data import BOS_ID, EOS_ID, PAD_ID, eval_batches, split_prompt_answer
from tfmjax.models import build
from tfmjax.models.checks import check_batch
from tfmjax.train.losses import cross_entropy, token_accuracy
from tfmjax.train.step import targets_and_mask

EVAL_SEED = 0  # the eval stream is the same for every run (train.seed changes only training)
NUM_ROWS = 5   # example rows kept for reports


def _finish(out: jax.Array) -> jax.Array:
    """PAD every position after the first EOS of each row. ``[B,M] -> [B,M]``."""
    seen_eos = jnp.cumsum(out == EOS_ID, axis=1) - (out == EOS_ID)
    return jnp.where(seen_eos > 0, PAD_ID, out)


def _greedy_encoder_decoder(model, params, batch, max_new_tokens: int) -> jax.Array:
    inputs = batch["inputs"]
    B, M = inputs.shape[0], max_new_tokens
    encoded = model.apply(params, inputs, method="encode")
    enc_segments = (inputs != PAD_ID).astype(jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(M), (B, M))
    segments = jnp.ones((B, M), jnp.int32)

    def body(j, carry):
        ids, out = carry
        logits, _ = model.apply(params, ids, positions, segments, encoded, enc_segments,
                                method="decode")
        y = jnp.argmax(logits[:, j], axis=-1).astype(jnp.int32)  # [B]
        out = out.at[:, j].set(y)
        ids = jnp.where(j + 1 < M, ids.at[:, jnp.minimum(j + 1, M - 1)].set(y), ids)
        return ids, out

    ids = jnp.zeros((B, M), jnp.int32).at[:, 0].set(BOS_ID)
    return jax.lax.fori_loop(0, M, body, (ids, jnp.zeros((B, M), jnp.int32)))[1]


def _greedy_decoder_only(model, params, batch, max_new_tokens: int) -> jax.Array:
    tokens, prompt_len = batch["tokens"], batch["prompt_len"]
    B, W = tokens.shape
    rows = jnp.arange(B)
    idx = jnp.broadcast_to(jnp.arange(W), (B, W))
    shifted = jnp.pad(tokens, ((0, 0), (1, 0)), constant_values=BOS_ID)[:, :-1]
    ids = jnp.where(idx <= prompt_len[:, None], shifted, PAD_ID).astype(jnp.int32)
    segments = jnp.ones((B, W), jnp.int32)

    def body(j, carry):
        ids, out = carry
        logits, _ = model.apply(params, ids, idx, segments, method="forward")
        t = prompt_len + j  # [B] position whose token is predicted now
        y = jnp.argmax(logits[rows, jnp.minimum(t, W - 1)], axis=-1).astype(jnp.int32)
        y = jnp.where(t < W, y, PAD_ID)
        out = out.at[:, j].set(y)
        ids = ids.at[rows, jnp.minimum(t + 1, W - 1)].set(jnp.where(t + 1 < W, y, ids[rows, W - 1]))
        return ids, out

    out = jnp.zeros((B, max_new_tokens), jnp.int32)
    return jax.lax.fori_loop(0, max_new_tokens, body, (ids, out))[1]


def greedy_predict(model, params, batch: dict, family: str, max_new_tokens: int) -> jax.Array:
    """Greedy answers ``[B, max_new_tokens]`` int32: the target tokens, EOS, then PAD.

    Encoder-decoder: decodes from BOS given ``batch["inputs"]``. Decoder-only: continues
    each row of ``batch["tokens"]`` after its prompt (``batch["prompt_len"]``, incl. SEP);
    the answer part of ``tokens`` is never read. Uncached: one full forward per token.
    """
    if family == "encoder_decoder":
        out = _greedy_encoder_decoder(model, params, batch, max_new_tokens)
    else:
        out = _greedy_decoder_only(model, params, batch, max_new_tokens)
    return _finish(out)


def answer_targets(batch: dict, family: str, max_new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference answers aligned with :func:`greedy_predict`: ``(ids, mask)``, ``[B,M]``."""
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
    """Fixed eval batches of one split, with the jitted teacher-forced and greedy functions."""

    def __init__(self, model_config, task, *, batch_size: int, num_examples: int,
                 split: str = "eval", seed: int = EVAL_SEED):
        self.family, self.task, self.split = model_config.family, task, split
        self.num_examples = num_examples
        self.batches = eval_batches(task, family=self.family, batch_size=batch_size,
                                    num_examples=num_examples, seed=seed, split=split)
        for batch in self.batches:
            check_batch(batch, model_config)
        self.max_new_tokens = task.max_target_len(split) + 1  # + EOS
        model = build(model_config, deterministic=True)
        self._row_sums = jax.jit(functools.partial(row_sums, model, family=self.family))
        self._greedy = jax.jit(functools.partial(greedy_predict, model, family=self.family,
                                                 max_new_tokens=self.max_new_tokens))

    def __call__(self, params, num_rows: int = NUM_ROWS) -> tuple[dict, list[dict]]:
        start = time.perf_counter()
        sums = {"nll": 0.0, "tokens": 0.0, "correct": 0.0, "exact": 0}
        left, rows = self.num_examples, []
        for batch in self.batches:
            n = min(left, len(batch[next(iter(batch))]))
            per_row = jax.device_get(self._row_sums(params, batch))
            predictions = np.asarray(self._greedy(params, batch))
            targets, mask = answer_targets(batch, self.family, self.max_new_tokens)
            exact = np.all((predictions == targets) | ~mask, axis=1)
            for key in ("nll", "tokens", "correct"):
                sums[key] += float(np.sum(per_row[key][:n], dtype=np.float64))
            sums["exact"] += int(exact[:n].sum())
            if len(rows) < num_rows:
                rows += decode_rows(self.task, batch, predictions, exact, self.family,
                                    min(n, num_rows - len(rows)))
            left -= n
        return self._metrics(sums, time.perf_counter() - start), rows

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
                        batch_size: int | None = None, num_rows: int = NUM_ROWS) -> dict:
    """Evaluate the params of a checkpoint (a workdir, its ``checkpoints`` dir or a step dir).

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
                              num_examples=num_examples or data.eval_examples, split=split)
    except (ValueError, InputError) as err:
        raise ConfigError(str(err)) from None
    metrics, rows = evaluator(params, num_rows=num_rows)
    return {"checkpoint": str(path), "workdir": str(workdir),
            "step": step if step is not None else _latest_step(workdir),
            "experiment": experiment.name, "family": experiment.model.family, "task": data.task,
            "split": split, **metrics, "examples": rows}


def format_report(report: dict) -> str:
    """A printable table: the metrics, then a few input / prediction / target rows."""
    lines = [f"checkpoint      {report['checkpoint']} (step {report['step']})",
             f"model / task    {report['family']} / {report['task']}",
             f"split           {report['split']} ({report['num_examples']} examples)"]
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
