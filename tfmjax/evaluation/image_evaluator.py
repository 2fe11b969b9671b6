"""Evaluation on an image set: test loss and accuracy of the class the model names.

``ImageEvaluator(model_config, source, ...)(params) -> (metrics, rows)``, the image twin of
:class:`tfmjax.evaluation.evaluator.Evaluator`, over the held-out test images
(:class:`tfmjax.data.images.ImageSource`, split "eval"), each read once, in order, in batches
of ``batch_size`` (the last one padded with copies of the first image, never counted).
Metrics (over ``min(num_examples, test images)`` images):
  loss, perplexity  NLL of the label per image (and exp of it)
  accuracy          share of images whose argmax class is the label
  chance_accuracy   the baseline that always names the most frequent training class
Rows: the first few images as text (the 8x8 pixels in shades), the class named and the label.
"""

from __future__ import annotations

import functools
import math
import time

import jax
import numpy as np

from tfmjax.evaluation.evaluator import NUM_ROWS, row_sums
from tfmjax.models import build
from tfmjax.parallel.processes import to_host

SHADES = " .:-=+*#%@"  # pixel value 0..1 as a character, dark to bright


class ClassTokenArgmax:
    """What an image model's answer is: the argmax of its class token's logits (the
    ``decode`` line of a report)."""

    def __repr__(self) -> str:
        return "class-token argmax"


def image_text(image: np.ndarray) -> str:
    """An image ``[Hi,Wi,C]`` in [0, 1] as rows of shade characters joined by ``/``."""
    gray = np.clip(np.asarray(image).mean(axis=-1), 0.0, 1.0)
    chars = np.asarray(list(SHADES))[np.round(gray * (len(SHADES) - 1)).astype(int)]
    return "/".join("".join(row) for row in chars)


class ImageEvaluator:
    """The test images in fixed batches and the jitted per-image sums."""

    metric_names = ("loss", "perplexity", "accuracy", "chance_accuracy")

    def __init__(self, model_config, source, *, batch_size: int, num_examples: int, **_):
        self.model = model = build(model_config, deterministic=True)
        self.source, self.strategy = source, ClassTokenArgmax()
        images, labels = source.split_arrays("eval")
        self.num_examples = n = min(num_examples, len(labels))
        images, labels = images[:n], labels[:n]
        pad = -n % batch_size
        self.images = np.concatenate([images, np.repeat(images[:1], pad, axis=0)])
        self.labels = np.concatenate([labels, np.repeat(labels[:1], pad, axis=0)])
        self.batch_size = batch_size
        for start in range(0, len(self.labels), batch_size):
            model.check_batch(self._batch(start))
        train_labels = source.split_arrays("train")[1]
        self.chance = float(np.mean(labels == np.bincount(train_labels).argmax()))
        self._row_sums = jax.jit(functools.partial(row_sums, model))
        self._classes = jax.jit(lambda params, batch: model.apply(params, batch)[:, 0].argmax(-1))

    def _batch(self, start: int) -> dict:
        end = start + self.batch_size
        return {"images": self.images[start:end], "labels": self.labels[start:end]}

    def __call__(self, params, num_rows: int = NUM_ROWS) -> tuple[dict, list[dict]]:
        begin = time.perf_counter()
        nll = correct = 0.0
        named = []
        for start in range(0, len(self.labels), self.batch_size):
            batch = self._batch(start)
            n = min(self.batch_size, self.num_examples - start)
            sums = to_host(self._row_sums(params, batch))
            nll += float(np.sum(sums["nll"][:n], dtype=np.float64))
            correct += float(np.sum(sums["correct"][:n], dtype=np.float64))
            if len(named) < num_rows:
                named += list(np.asarray(to_host(self._classes(params, batch)))[:n])
        loss = nll / self.num_examples
        metrics = {
            "loss": loss,
            "perplexity": math.exp(min(loss, 80.0)),
            "accuracy": correct / self.num_examples,
            "chance_accuracy": self.chance,
            "num_examples": self.num_examples,
            "timing": {"eval_sec": time.perf_counter() - begin},
        }
        return metrics, self._rows(named[:num_rows])

    def _rows(self, named: list) -> list[dict]:
        label = self.source.label
        return [
            {
                "input": image_text(self.images[i]),
                "prediction": label(int(c)),
                "target": label(int(self.labels[i])),
                "correct": bool(int(c) == int(self.labels[i])),
            }
            for i, c in enumerate(named)
        ]
