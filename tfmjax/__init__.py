"""tfmjax: a JAX/Flax model zoo of transformers.

The Python API (:mod:`tfmjax.api`), for notebooks; imported on first use, so
``import tfmjax`` stays cheap::

    exp = tfmjax.experiment("configs/reverse.toml", {"train.steps": 300})
    tfmjax.fit(exp)
    m = tfmjax.load(exp.workdir)
    tfmjax.generate_text(m, "c a b"), tfmjax.generate_ids(m, [[7, 5, 6]]), tfmjax.evaluate(m)
"""

import importlib

__version__ = "0.1.0"

_API = ("experiment", "fit", "load", "Loaded", "generate_text", "generate_ids", "evaluate")

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module("tfmjax.api"), name)
    raise AttributeError(f"module 'tfmjax' has no attribute {name!r}")
