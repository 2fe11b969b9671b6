"""Reporting: where records go and how they print, for training and evaluation alike.

Files: ``metrics_log`` (``metrics.jsonl`` and TensorBoard, reading records back),
``console`` (the progress bar, one line per record, text samples). Imports nothing else of
tfmjax, so every layer above may use it.
"""

from tfmjax.reporting.console import Console, format_record, format_sample
from tfmjax.reporting.metrics_log import (
    METRICS_FILE,
    MetricsLog,
    NullLog,
    deterministic_part,
    read_records,
)

__all__ = [
    "METRICS_FILE",
    "Console",
    "MetricsLog",
    "NullLog",
    "deterministic_part",
    "format_record",
    "format_sample",
    "read_records",
]
