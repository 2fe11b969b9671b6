"""Toy seq2seq tasks and deterministic fixed-shape batching (pure Python + NumPy).

task = make_task("reverse", max_len=8)
batch = make_batch(task, batch_format="prompt_answer", batch_size=32, seed=0, step=step)
"""

from tfmjax.data.base import SPLITS, Task, example_split
from tfmjax.data.batching import (
    BATCH_FORMATS,
    batch_widths,
    collate,
    eval_batches,
    iterate_batches,
    make_batch,
    split_prompt_answer,
)
from tfmjax.data.tasks import TASK_NAMES, make_task, task_defaults
from tfmjax.data.vocab import BOS_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID, Vocab

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "BATCH_FORMATS",
    "MASK_ID",
    "PAD_ID",
    "SEP_ID",
    "SPLITS",
    "TASK_NAMES",
    "Task",
    "Vocab",
    "batch_widths",
    "collate",
    "eval_batches",
    "example_split",
    "iterate_batches",
    "make_batch",
    "make_task",
    "split_prompt_answer",
    "task_defaults",
]
