"""``model.safetensors`` read and written through the ``safetensors`` NumPy API (no torch).

Arrays keep their dtype on disk (float32, float16, bfloat16); :func:`read` returns them as
they are stored, :func:`write` stores them as given.
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from tfmjax.hf.errors import HFError

WEIGHTS = "model.safetensors"
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(jnp.bfloat16),
}


def read(directory: str | Path) -> dict[str, np.ndarray]:
    """``{name: array}`` of ``directory/model.safetensors``."""
    path = Path(directory) / WEIGHTS
    if not path.is_file():
        sharded = sorted(Path(directory).glob("model-*.safetensors"))
        hint = " (sharded checkpoints are not supported)" if sharded else ""
        raise HFError(f"{path} does not exist{hint}: save the model with save_pretrained")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise HFError(f"{path} is not a readable safetensors file: {err}") from None


def write(directory: str | Path, tensors: dict[str, np.ndarray]) -> Path:
    """Write ``tensors`` to ``directory/model.safetensors`` (format ``pt``, as transformers)."""
    path = Path(directory) / WEIGHTS
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
    save_file(arrays, str(path), metadata={"format": "pt"})
    path.chmod(0o666 & ~_umask())  # safetensors writes 0600; a file is readable as usual
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stored_dtype(directory: str | Path) -> str | None:
    """The floating dtype most tensors of ``directory/model.safetensors`` are stored in
    (``float32``, ``float16`` or ``bfloat16``; read from the header alone), None if none."""
    with open(Path(directory) / WEIGHTS, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    counts = Counter(
        SAFETENSORS_DTYPES[v["dtype"]]
        for k, v in header.items()
        if k != "__metadata__" and v["dtype"] in SAFETENSORS_DTYPES
    )
    return counts.most_common(1)[0][0] if counts else None


def dtype_of(name: str) -> np.dtype:
    """The NumPy dtype of ``float32``, ``float16`` or ``bfloat16``."""
    if name not in DTYPES:
        raise HFError(f"dtype={name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]
