"""Where metrics go: ``metrics.jsonl`` always, and TensorBoard when asked.

Every record is ``{"step": int, "split": "train"|"eval", <metric>: float, ...,
"timing": {...}}``. Wall-clock numbers (tokens/s, seconds) live under ``"timing"`` only,
so two runs can be compared with :func:`deterministic_part`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


def read_records(path: str | Path) -> list[dict]:
    """All records of a ``metrics.jsonl`` (a torn last line, from a kill, is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def deterministic_part(record: dict) -> dict:
    """A record without its wall-clock ``timing``: equal for an interrupted and a straight run."""
    return {k: v for k, v in record.items() if k != "timing"}


def _tensorboard_writer(directory: Path, enabled: bool):
    if not enabled:
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        print(
            "warning: train.tensorboard=true but tensorboardX is not installed "
            "(pip install tensorboardX); logging to metrics.jsonl only",
            file=sys.stderr,
        )
        return None
    return SummaryWriter(str(directory / "tensorboard"))


class MetricsLog:
    """Appends records to ``<workdir>/metrics.jsonl`` (and TensorBoard), flushed per record."""

    def __init__(self, workdir: str | Path, *, resume_step: int = 0, tensorboard: bool = False):
        self.path = Path(workdir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.truncate_after(resume_step)
        self._file = self.path.open("a")
        self._tb = _tensorboard_writer(self.path.parent, tensorboard)

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (a resumed run rewrites them), atomically."""
        kept = [r for r in read_records(self.path) if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(f"{record['split']}/{key}", value, record["step"])
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


class NullLog:
    """What the processes other than process 0 log to: nothing (one writer per workdir)."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass
