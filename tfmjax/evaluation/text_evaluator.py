"""Evaluation on a text corpus: validation loss, perplexity, bits per character, samples.

``TextEvaluator(model_config, source, ...)(params) -> (metrics, rows)``, the text twin of
:class:`tfmjax.evaluation.evaluator.Evaluator`, over fixed validation windows
(:class:`tfmjax.data.text.TextSource`). Metrics (teacher-forced, over every target token):
  loss, perplexity   NLL per token (nats) and exp of it: these depend on the tokenizer;
  bits_per_char      total NLL / ln 2 / characters those tokens spell (EOS counts as one):
                     comparable across tokenizers (language models only);
  token_accuracy     argmax accuracy; for a masked LM this is the masked-token accuracy,
                     reported with ``unigram_accuracy``, the baseline that always predicts
                     the most frequent training token.
Rows: for a model that generates, ``samples`` continuations of the first ``PROMPT_TOKENS``
tokens of fixed validation windows, sampled with top-k and temperature from the task params
(a fixed key, so the same params give the same text), ``sample_tokens`` long or as far as
``model.max_len`` allows; for a masked LM, a few windows with their masks and the model's
fill-ins.
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from tfmjax.data.images import ImageSource
from tfmjax.data.text import TextSource
from tfmjax.data.vocab import MASK_ID, RESERVED_TOKENS
from tfmjax.decode import TopK, generate
from tfmjax.evaluation.evaluator import EVAL_SEED, NUM_ROWS, Evaluator, teacher_forced_sums
from tfmjax.evaluation.image_evaluator import ImageEvaluator
from tfmjax.models import build
from tfmjax.models.checks import auto_may_run_cudnn
from tfmjax.parallel.processes import to_host

PROMPT_TOKENS = 16  # tokens of a validation window that a sample continues


class TextEvaluator:
    """Fixed validation batches of a text source and the jitted teacher-forced sums."""

    def __init__(
        self,
        model_config,
        source: TextSource,
        *,
        batch_size: int,
        num_examples: int,
        split: str = "eval",
        seed: int = EVAL_SEED,
        decode_seed: int = 0,
    ):
        self.model = model = build(model_config, deterministic=True)
        self.source, self.split, self.num_examples = source, split, num_examples
        source.check_split(split)
        self.batches = [
            source.batch(
                batch_format=model.batch_format,
                batch_size=batch_size,
                seed=seed,
                step=step,
                split=split,
            )
            for step in range(-(-num_examples // batch_size))
        ]
        for batch in self.batches:
            model.check_batch(batch, auto_may_run_cudnn(model_config))
        self.decode_key = jax.random.key(decode_seed)
        p = source.params
        self.strategy = TopK(
            k=min(p.top_k, model_config.vocab_size) or 1, temperature=p.temperature
        )
        prompt_tokens = min(PROMPT_TOKENS, p.context // 4 or 1)
        self.prompts = np.asarray(self.batches[0]["tokens"][: p.samples, :prompt_tokens])
        # A sample never runs past the model's positions (a learned table ends at max_len).
        self.sample_tokens = min(p.sample_tokens, model_config.max_len - prompt_tokens)
        self._row_sums = teacher_forced_sums(model)
        self._guesses = jax.jit(lambda params, tokens: model.apply(params, tokens).argmax(-1))
        if model.batch_format == "masked_lm":
            counts = np.bincount(source.ids["train"], minlength=source.vocab_size)
            counts[: len(RESERVED_TOKENS)] = 0
            self.unigram_id = int(np.argmax(counts))

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The metrics (floats) a call returns; ``train.best_metric`` must be one of them."""
        last = "unigram_accuracy" if self.model.batch_format == "masked_lm" else "bits_per_char"
        return ("loss", "perplexity", "token_accuracy", last)

    def __call__(self, params, num_rows: int = NUM_ROWS) -> tuple[dict, list[dict]]:
        start = time.perf_counter()
        sums = {"nll": 0.0, "tokens": 0.0, "correct": 0.0, "chars": 0.0, "unigram": 0.0}
        left = self.num_examples
        for batch in self.batches:
            n = min(left, batch["tokens"].shape[0])
            per_row = to_host(self._row_sums(params, batch))
            for key in ("nll", "tokens", "correct"):
                sums[key] += float(np.sum(per_row[key][:n], dtype=np.float64))
            targets, mask = (np.asarray(a)[:n] for a in self.model.targets_and_mask(batch))
            sums["chars"] += float(np.sum(self.source.char_lengths[targets] * mask))
            if self.model.batch_format == "masked_lm":
                sums["unigram"] += float(np.sum((targets == self.unigram_id) * mask))
            left -= n
        rows = self._rows(params, num_rows)
        return self._metrics(sums, time.perf_counter() - start), rows

    def _rows(self, params, num_rows: int) -> list[dict]:
        tok = self.source.tokenizer
        if self.model.batch_format == "masked_lm":
            batch = self.batches[0]
            # the whole batch, whose rows split over a mesh's batch axes as the loss's do
            guesses = to_host(self._guesses(params, {"tokens": batch["tokens"]}))
            guess = np.asarray(guesses)[:num_rows]
            tokens = np.asarray(batch["tokens"][:num_rows])
            filled = np.where(tokens == MASK_ID, guess, tokens)
            return [
                {
                    "input": tok.decode(tokens[i]),
                    "prediction": tok.decode(filled[i]),
                    "target": tok.decode(batch["targets"][i]),
                }
                for i in range(len(tokens))
            ]
        if not self.model.can_generate or len(self.prompts) == 0 or self.sample_tokens < 1:
            return []
        out = generate(
            self.model,
            params,
            self.prompts,
            self.strategy,
            self.sample_tokens,
            rng=self.decode_key,
            eos_id=None,
        )
        return [
            {"prompt": tok.decode(prompt), "continuation": tok.decode(row)}
            for prompt, row in zip(self.prompts, to_host(out.tokens), strict=True)
        ]

    def _metrics(self, sums: dict, seconds: float) -> dict:
        tokens = max(sums["tokens"], 1.0)
        loss = sums["nll"] / tokens
        metrics = {
            "loss": loss,
            "perplexity": math.exp(min(loss, 80.0)),
            "token_accuracy": sums["correct"] / tokens,
        }
        if self.model.batch_format == "masked_lm":
            metrics["unigram_accuracy"] = sums["unigram"] / tokens
        else:
            metrics["bits_per_char"] = sums["nll"] / math.log(2) / max(sums["chars"], 1.0)
        metrics.update(num_examples=self.num_examples, timing={"eval_sec": seconds})
        return metrics


def make_evaluator(model_config, source, **kwargs):
    """The evaluator of a :mod:`tfmjax.data.sources` source: :class:`TextEvaluator` for a
    corpus (``strategy`` is ignored: samples use the task's top-k), :class:`ImageEvaluator`
    for an image set (nothing is decoded: the class token's argmax), else
    :class:`Evaluator`."""
    if isinstance(source, ImageSource):
        kwargs.pop("strategy", None)
        return ImageEvaluator(model_config, source, **kwargs)
    if isinstance(source, TextSource):
        kwargs.pop("strategy", None)
        return TextEvaluator(model_config, source, **kwargs)
    return Evaluator(model_config, source.task, **kwargs)
