"""The console: a progress bar or plain lines, and how records and samples print.

Shared by training (a line per log step) and evaluation (a report's samples).
"""

from __future__ import annotations

import shutil
import sys


def format_record(record: dict) -> str:
    """One console line: ``train step 100  loss 1.234  acc 0.567 ...``."""
    short = {
        "loss": "loss",
        "token_accuracy": "acc",
        "exact_match": "exact",
        "accuracy": "acc",  # an image classifier's test accuracy
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
