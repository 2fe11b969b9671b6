"""Checkpoint errors: the one the user reads, and a corrupt step (internal: try the next)."""

from __future__ import annotations

import re


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message says which and why, in one line."""


class CorruptStep(Exception):
    """This step failed verification; ``str(self)`` is the short reason (try an older step)."""


def short_error(exc: BaseException, limit: int = 160) -> str:
    """The innermost cause of ``exc`` as one short line (tensorstore specs and paths cut)."""
    chain, err = [], exc
    while err is not None and len(chain) < 10:
        chain.append(err)
        err = err.__cause__ or err.__context__
    inner = chain[-1]
    lines = str(inner).strip().splitlines()
    text = lines[0].strip(" '\"") if lines else ""
    if match := re.search(r'Item "([^"]+)" was not found', text):
        return f'item "{match[1]}" is missing'
    text = re.sub(r"\s*\[tensorstore_spec.*$", "", text)
    text = re.sub(r' in OCDBT database at [^"]*"[^"]*"', "", text)
    text = re.sub(r'(Error opening "\w+" driver: )+', "", text)
    if not re.match(r"[A-Z_]{4,}: ", text):  # tensorstore status codes speak for themselves
        text = f"{type(inner).__name__}: {text}" if text else type(inner).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
