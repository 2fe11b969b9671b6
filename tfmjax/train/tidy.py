"""A run that ends before it saves anything leaves nothing behind in its workdir.

:class:`Created` notes which parts of a workdir (the workdir itself, ``checkpoints/``,
``metrics.jsonl``, ``tensorboard/``) did not exist before the run; the training loop removes
those the run made that are still empty, so a run stopped or failing before its
first step (a Ctrl-C while compiling, a bad batch) leaves the workdir as it found it. What a
run saved or logged is never removed: only an empty directory or an empty file goes.
"""

from __future__ import annotations

from pathlib import Path

from tfmjax.checkpoint.store import CHECKPOINTS_SUBDIR
from tfmjax.reporting.metrics_log import METRICS_FILE

TENSORBOARD_DIR = "tensorboard"


class Created:
    """The parts of ``workdir`` that do not exist yet (make it before the run makes them).

    Call :meth:`tidy_parts` while holding the workdir's lock (another run may make them
    next) and :meth:`tidy_workdir` once it is released (an empty directory only goes).
    """

    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir)
        parts = (CHECKPOINTS_SUBDIR, METRICS_FILE, TENSORBOARD_DIR)
        self.parts = [self.workdir / name for name in parts if not (self.workdir / name).exists()]
        self.made_workdir = not self.workdir.exists()

    def tidy_parts(self) -> None:
        """Remove each part this run made that is still empty; anything else stays."""
        for path in self.parts:
            try:
                if path.is_dir():
                    path.rmdir()  # only if empty
                elif path.stat().st_size == 0:
                    path.unlink()
            except OSError:  # not empty, or gone already
                continue

    def tidy_workdir(self) -> None:
        """Remove the workdir if this run made it and it is empty."""
        if self.made_workdir:
            try:
                self.workdir.rmdir()
            except OSError:  # not empty, or gone already
                pass

    def saved_line(self) -> str:
        """What the workdir holds now: the newest finished checkpoint, or nothing."""
        directory = self.workdir / CHECKPOINTS_SUBDIR
        steps = [int(p.name) for p in directory.glob("*") if p.name.isdigit()]
        if steps:
            return f"the last saved checkpoint (step {max(steps)}) is intact"
        return "nothing was saved"
