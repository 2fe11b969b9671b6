"""Evaluation: scoring params on a task, a text corpus or an image set, and a checkpoint's
report.

Files: ``evaluator`` (a toy task: teacher-forced loss, decoded exact-match),
``text_evaluator`` (a text corpus: loss, bits per character, samples; ``make_evaluator``
picks the one a source needs), ``image_evaluator`` (an image set: test accuracy),
``report`` (what ``eval.py`` runs: evaluate a checkpoint, format and write the report).
"""

from tfmjax.evaluation.evaluator import Evaluator
from tfmjax.evaluation.image_evaluator import ImageEvaluator
from tfmjax.evaluation.report import evaluate_checkpoint, format_report, write_report
from tfmjax.evaluation.text_evaluator import TextEvaluator, make_evaluator

__all__ = [
    "Evaluator",
    "ImageEvaluator",
    "TextEvaluator",
    "evaluate_checkpoint",
    "format_report",
    "make_evaluator",
    "write_report",
]
