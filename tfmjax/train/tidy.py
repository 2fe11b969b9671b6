"""A run that ends before it saves anything leaves nothing behind in its workdir.

:class:`Created` notes which parts of a workdir (the workdir itself, ``checkpoints/``,
``metrics.jsonl``, ``tensorboard/``) did not exist before the run; :meth:`Created.tidy`
removes those the run made that are still empty, so a run stopped or failing before its
first step (a Ctrl-C while compiling, a bad batch) leaves the workdir as it found it. What a
run saved or logged is never removed: only an empty directory or an empty file goes.
"""

from __future__ import annotations

from pathlib import Path

from tfmjax.checkpoint.store import CHECKPOINTS_SUBDIR
from tfmjax.reporting.metrics_log import METRICS_FILE

TENSORBOARD_DIR = "tensorboard"


class Created:
    """The parts of ``workdir`` that do not exist yet (call before the run makes them)."""

    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir)
        parts = (CHECKPOINTS_SUBDIR, METRICS_FILE, TENSORBOARD_DIR)
        candidates = [self.workdir / name for name in parts] + [self.workdir]
        self.paths = [path for path in candidates if not path.exists()]  # the workdir last

    def tidy(self, *first: Path) -> None:
        """Remove ``first`` (e.g. the lock file this process holds), then each part this run
        created that is still empty; anything else stays."""
        for path in (*first, *self.paths):
            try:
                if path.is_dir():
                    path.rmdir()  # only if empty
                elif path in first or path.stat().st_size == 0:
                    path.unlink()
            except OSError:  # not empty, gone already, or not ours to remove
                continue

    def saved_line(self) -> str:
        """What the workdir holds now: the newest finished checkpoint, or nothing."""
        directory = self.workdir / CHECKPOINTS_SUBDIR
        steps = [int(p.name) for p in directory.glob("*") if p.name.isdigit()]
        if steps:
            return f"the last saved checkpoint (step {max(steps)}) is intact"
        return "nothing was saved"
