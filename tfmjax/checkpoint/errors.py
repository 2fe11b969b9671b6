"""Checkpoint errors: the one the user reads, and a corrupt step (internal: try the next)."""

from __future__ import annotations

import errno
import re


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message says which and why, in one line."""


class CorruptStep(Exception):
    """This step failed verification; ``str(self)`` is the short reason (try an older step)."""


def _chain(exc: BaseException) -> list[BaseException]:
    chain, err = [], exc
    while err is not None and len(chain) < 10:
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def short_error(exc: BaseException, limit: int = 160) -> str:
    """The innermost cause of ``exc`` as one short line (tensorstore specs and paths cut)."""
    chain = _chain(exc)
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


# (errno, tensorstore status code, words in the text) -> what happened, what to do
_SAVE_CAUSES = (
    (
        (errno.ENOSPC,),
        ("RESOURCE_EXHAUSTED",),
        ("no space left on device",),
        "no space left on device: free space there or set train.workdir to a larger disk",
    ),
    (
        (errno.EDQUOT,),
        (),
        ("disk quota exceeded",),
        "disk quota exceeded: free space there or set train.workdir to another disk",
    ),
    (
        (errno.EROFS,),
        (),
        ("read-only file system",),
        "read-only file system: remount it read-write or set train.workdir to a writable disk",
    ),
    (
        (errno.EACCES, errno.EPERM),
        ("PERMISSION_DENIED",),
        ("permission denied", "operation not permitted"),
        "permission denied: make the directory writable for this user or set train.workdir",
    ),
    (
        (errno.ENOTDIR,),
        (),
        ("not a directory",),
        "not a directory (a file is in the way): move that file away or set train.workdir",
    ),
    (
        (errno.ENOENT,),
        ("NOT_FOUND",),
        ("no such file or directory",),
        "the directory was removed while saving: keep the workdir in place while training "
        "or set train.workdir",
    ),
)


def save_cause(exc: BaseException) -> str:
    """Why a save failed, in plain words with what to do; else the short error.

    Looks at the whole exception chain: an ``OSError``'s errno or the ``os_error_code``
    (tensorstore) or ``[Errno N]`` (Python) in a message first, then tensorstore's status
    code, then the usual error words.
    """
    chain = _chain(exc)
    texts = [str(err) for err in chain]
    codes = {err.errno for err in chain if isinstance(err, OSError) and err.errno}
    for text in texts:
        for match in re.finditer(r"os_error_code='?(\d+)|\[Errno (\d+)\]", text):
            codes.add(int(match[1] or match[2]))
    lowered = [text.lower() for text in texts]
    for nums, _, _, plain in _SAVE_CAUSES:
        if codes.intersection(nums):
            return plain
    for _, statuses, _, plain in _SAVE_CAUSES:
        if any(re.search(rf"\b{status}\b", text) for status in statuses for text in texts):
            return plain
    for _, _, words, plain in _SAVE_CAUSES:
        if any(word in text for word in words for text in lowered):
            return plain
    return short_error(exc)
