"""``model.safetensors`` read and written through the ``safetensors`` NumPy API (no torch).

Arrays keep their dtype on disk (float32, float16, bfloat16); :func:`read` returns them as
they are stored, :func:`write` stores them as given.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from tfmjax.hf.errors import HFError

WEIGHTS = "model.safetensors"
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
    return path


def dtype_of(name: str) -> np.dtype:
    """The NumPy dtype of ``float32``, ``float16`` or ``bfloat16``."""
    if name not in DTYPES:
        raise HFError(f"dtype={name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]
