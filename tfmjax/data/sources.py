"""One door to the training data: a toy task or a text corpus, by ``data.task``'s name.

``open_source(name, params)`` returns a :class:`ToySource` (a :mod:`tfmjax.data.tasks` task,
built in or your own ``"PATH.py:Class"``), a :class:`~tfmjax.data.text.TextSource` (a
corpus: ``"shakespeare"``, or your own ``"text:PATH"``) or an
:class:`~tfmjax.data.images.ImageSource` (labelled images: ``"digits"``). Each answers
``batch(batch_format=, batch_size=, seed=, step=, split=)`` with a pure function of its
arguments, ``batch_formats`` (the layouts it serves), ``vocab_size``, ``check_split`` and
``assets`` (what a checkpoint keeps of them: the tokenizer, where your own task or text was
found).
"""

from __future__ import annotations

import difflib
from typing import Any

from tfmjax.config.task_spec import TEXT_PREFIX, parse_task_spec
from tfmjax.data.base import Task
from tfmjax.data.batching import BATCH_FORMATS, make_batch
from tfmjax.data.images import IMAGE_SETS, ImageSource
from tfmjax.data.tasks import TASK_NAMES, open_task
from tfmjax.data.text import CORPORA, TextSource
from tfmjax.data.tokenizers import Tokenizer

DATA_NAMES = TASK_NAMES + CORPORA + IMAGE_SETS


class ToySource:
    """A toy seq2seq task behind the source interface (``task`` is the task itself)."""

    batch_formats = BATCH_FORMATS

    def __init__(self, task: Task, origin: dict | None = None):
        self.task = task
        self.origin = origin  # where an imported task class was found

    @property
    def vocab_size(self) -> int:
        return self.task.vocab.size

    @property
    def digit_ids(self) -> tuple[int, ...]:
        return self.task.digit_ids

    def check_split(self, split: str) -> None:
        self.task.check_split(split)

    def batch(
        self, *, batch_format: str, batch_size: int, seed: int, step: int, split="train", rows=None
    ):
        return make_batch(
            self.task,
            batch_format=batch_format,
            batch_size=batch_size,
            seed=seed,
            step=step,
            split=split,
            rows=rows,
        )

    def assets(self) -> dict:
        return {"task_origin": self.origin} if self.origin else {}


def is_text(name: str) -> bool:
    """Whether ``data.task=name`` is a text corpus (rather than a toy task)."""
    return name in CORPORA or name.startswith(TEXT_PREFIX)


def open_source(
    name: str,
    params: dict[str, Any],
    *,
    tokenizer: Tokenizer | None = None,
    origin: dict | None = None,
) -> ToySource | TextSource | ImageSource:
    """The data ``data.task=name`` with ``data.task_params=params``; ValueError (one line)
    for an unknown name or parameter. ``tokenizer``: a text corpus's saved tokenizer;
    ``origin``: where a checkpoint's own task or text file was found (its ``task_origin``)."""
    kind = parse_task_spec(name).kind
    if kind == "name" and name not in DATA_NAMES:
        close = difflib.get_close_matches(str(name), DATA_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown task {name!r}{hint} (toy tasks: {', '.join(TASK_NAMES)}; text corpora: "
            f"{', '.join(CORPORA)}; image sets: {', '.join(IMAGE_SETS)}; your own: text:PATH, "
            "PATH.py:Class)"
        )
    if name in IMAGE_SETS:
        return ImageSource(name, params)
    if is_text(name):
        return TextSource(name, params, tokenizer=tokenizer, origin=origin)
    return ToySource(*open_task(name, params, origin))
