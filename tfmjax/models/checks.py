"""Input checks at the boundary, on the host (NumPy), before a batch reaches jit.

JAX clamps out-of-range gathers silently, so a bad token id would otherwise train or
decode on the wrong embedding row without a word. These checks cost microseconds on the
host and nothing inside the jitted step. ``model.check_batch(batch)`` applies them to every
token array of a family's batch (:class:`tfmjax.models.family.Family`).
"""

from __future__ import annotations

import jax
import numpy as np

from tfmjax import compat
from tfmjax.config import ModelConfig
from tfmjax.kernels.dispatch import cudnn_min_len


class InputError(ValueError):
    """A batch the model cannot take; the message is one line that says what and where."""


def check_tokens(ids, vocab_size: int, name: str = "tokens") -> None:
    """Raise :class:`InputError` if any id is outside ``[0, vocab_size)``."""
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name} has token id {int(ids[where])} at index {list(where)} outside "
            f"the vocabulary [0, {vocab_size}); check the tokenizer or model.vocab_size"
        )


def check_length(length: int, config: ModelConfig, name: str = "tokens") -> None:
    """Raise :class:`InputError` if a sequence is longer than ``model.max_len``.

    Enforced for every position encoding: a learned table would clamp silently past it, and
    the others were never trained there either.
    """
    if length > config.max_len:
        raise InputError(
            f"{name} has length {length} but the model takes at most "
            f"model.max_len={config.max_len}; shorten the input or raise model.max_len"
        )


def check_concrete_tokens(ids, vocab_size: int, name: str) -> None:
    """:func:`check_tokens` when ``ids`` holds values (an eager call); skipped under a trace,
    where the host-side ``model.check_batch`` is the check."""
    if not isinstance(ids, jax.core.Tracer):
        check_tokens(ids, vocab_size, name)


def this_platform() -> str:
    """This process's platform as ``lax.platform_dependent`` names it: ``"cuda"`` or
    ``"rocm"`` for a GPU (jax calls both ``"gpu"``), else ``"cpu"`` or ``"tpu"``."""
    backend = jax.default_backend()
    if backend == "gpu":
        return "cuda" if compat.cuda_plugin_present() else "rocm"
    return backend


def auto_may_run_cudnn(config: ModelConfig, platform: str | None = None) -> bool:
    """Whether the training and evaluation steps may run cuDNN's fused attention under
    ``model.attention_impl="auto"`` on ``platform`` (default: :func:`this_platform`): on
    cuda, for a model whose ``max_len`` reaches the length from which
    :data:`tfmjax.kernels.AUTO_TABLE` names cuDNN. Then they are traced inside
    :func:`tfmjax.kernels.trailing_padding` and every batch is checked by
    :func:`check_trailing_padding`."""
    if config.attention_impl != "auto" or (platform or this_platform()) != "cuda":
        return False
    start = cudnn_min_len()
    return start is not None and config.max_len >= start


def check_trailing_padding(segment_ids, name: str, impl: str = "cudnn") -> None:
    """Raise :class:`InputError` unless every row of ``segment_ids [B,T]`` is 1 on its tokens
    and 0 from its first padding slot to the end: the only layout cuDNN can mask, since it
    takes padding as per-row lengths (:mod:`tfmjax.kernels.cudnn_attention`).
    ``impl``: the ``model.attention_impl`` that may run cuDNN (``"cudnn"`` or ``"auto"``)."""
    ids = np.asarray(segment_ids).astype(np.int64)  # a token mask's booleans print as 0 / 1
    lengths = np.count_nonzero(ids, axis=1)
    want = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    bad = np.flatnonzero(np.any(ids != want, axis=1))
    if bad.size:
        row = int(bad[0])
        runs = (
            "model.attention_impl='cudnn' masks"
            if impl == "cudnn"
            else "model.attention_impl='auto' may run cuDNN's attention on this GPU, which masks"
        )
        raise InputError(
            f"{name} row {row} is {ids[row].tolist()}: {runs} "
            "padding by per-row lengths, so each row must be one segment (ids 1) followed by "
            "padding (0); packed rows or padding before a token need attention_impl 'pallas' "
            "or 'xla'"
        )
