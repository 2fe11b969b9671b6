"""A checkpoint's data is the data it was trained on.

An own task file, task module or text file (``data.task = "PATH.py:Class"``,
``"module:Class"``, ``"text:PATH"``) is recorded in every checkpoint with a SHA-256 of its
bytes (the ``task_origin`` asset). Before such a checkpoint is evaluated, decoded from, taken
apart or resumed, the file found now is compared with that record: a changed file is refused
in one line, unless the caller accepts the change (``--accept-changed-data`` on the command
lines, ``accept_changed_data=True`` in Python); a resumed run then records the new digest in
the checkpoints it writes from the step it resumed at.
"""

from __future__ import annotations

import sys

from tfmjax.checkpoint.errors import CheckpointError
from tfmjax.data.user_data import data_change

ACCEPT_FLAG = "--accept-changed-data"


def check_same_data(recorded, current, *, step: int, accept: bool, stream=None) -> None:
    """Refuse (CheckpointError, one line) data ``current`` (the record of the file opened now)
    that differs from ``recorded`` (checkpoint ``step``'s ``task_origin``), unless ``accept``:
    then one note line on ``stream`` (stderr by default)."""
    change = data_change(recorded, current)
    if not change:
        return
    if not accept:
        raise CheckpointError(
            f"checkpoint step {step}: {change}: restore that file, or accept the change "
            f"with {ACCEPT_FLAG} (Python: accept_changed_data=True)"
        )
    print(f"note: checkpoint step {step}: {change}; accepted", file=stream or sys.stderr)


def add_argument(parser) -> None:
    """The command lines' ``--accept-changed-data`` flag (``args.accept_changed_data``)."""
    parser.add_argument(
        ACCEPT_FLAG,
        action="store_true",
        help="use an own task or text file (data.task) whose bytes differ from those the "
        "checkpoint recorded; a resumed run records the new ones",
    )
