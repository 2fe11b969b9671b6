"""Where metrics go: ``metrics.jsonl`` always, TensorBoard when asked, and the console.

Every record is ``{"step": int, "split": "train"|"eval", <metric>: float, ...,
"timing": {...}}``. Wall-clock numbers (tokens/s, seconds) live under ``"timing"`` only,
so two runs can be compared with :func:`deterministic_part`.
"""

from __future__ import annotations

import json
import os
import shutil
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


def format_record(record: dict) -> str:
    """One console line: ``train step 100  loss 1.234  acc 0.567 ...``."""
    short = {
        "loss": "loss",
        "token_accuracy": "acc",
        "exact_match": "exact",
        "grad_norm": "gnorm",
        "learning_rate": "lr",
        "perplexity": "ppl",
        "bits_per_char": "bpc",
        "unigram_accuracy": "unigram acc",
    }
    parts = [f"{record['split']:<5} step {record['step']:>6}"]
    for key, name in short.items():
        if key in record:
            value = record[key]
            parts.append(f"{name} {value:.3g}" if key == "learning_rate" else f"{name} {value:.4f}")
    timing = record.get("timing", {})
    if "tokens_per_sec" in timing:
        parts.append(f"{timing['tokens_per_sec']:,.0f} tok/s")
    if "eval_sec" in timing:
        parts.append(f"{timing['eval_sec']:.1f}s")
    return "  ".join(parts)


def format_sample(sample: dict, width: int = 300) -> str:
    """A text task's eval row, indented: a sampled continuation (``prompt`` + ``continuation``)
    or a masked LM's fill-ins (``input`` -> ``prediction``)."""
    if "continuation" in sample:
        text = f"{sample['prompt']}[{sample['continuation']}]"
    else:
        text = f"{sample['input']}\n  -> {sample['prediction']}"
    text = text if len(text) <= width else text[:width] + "..."
    return "\n".join("  | " + line for line in text.split("\n"))


class NullLog:
    """What the processes other than process 0 log to: nothing (one writer per workdir)."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class Console:
    """A tqdm bar with live loss and accuracy on a TTY; plain lines at log steps otherwise."""

    def __init__(self, *, total: int, initial: int, stream=None, progress: bool | None = None):
        self.stream = stream or sys.stdout
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = None
        if tty if progress is None else progress:
            from tqdm import tqdm

            sized = shutil.get_terminal_size((0, 0)).lines > 0  # a 0x0 pty hides tqdm's bar
            self.bar = tqdm(
                total=total,
                initial=initial,
                file=self.stream,
                dynamic_ncols=sized,
                ncols=None if sized else 100,
                nrows=None if sized else 24,
                unit="step",
                mininterval=0.25,
            )

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def record(self, record: dict) -> None:
        if self.bar is not None and record["split"] == "train":
            self.bar.set_postfix(
                loss=f"{record['loss']:.4f}", acc=f"{record['token_accuracy']:.3f}", refresh=False
            )
            return
        self.print(format_record(record))
        for sample in record.get("samples", []):
            self.print(format_sample(sample))

    def print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
