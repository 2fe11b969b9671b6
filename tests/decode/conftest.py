"""Shared tiny models for the decoding tests.

Parameters are drawn on the host with NumPy into the shapes ``jax.eval_shape(model.init)``
reports: compiling ``model.init`` per config would cost more than the test itself. Values are
scaled so a random model's next-token distributions are spread out (a tied N(0, 1) embedding
makes it repeat its input with probability ~1), which is what decoding tests need.
"""

import functools
import importlib.util
import pathlib

import pytest

from tfmjax.models import build, preset

_spec = importlib.util.spec_from_file_location(
    "tfmjax_tests_random_params", pathlib.Path(__file__).resolve().parents[1] / "random_params.py"
)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
random_params = _module.random_params


@functools.cache
def _tiny(name: str, overrides: tuple, embed_scale: float, seed: int):
    cfg = preset(name, **{"vocab_size": 16, "max_len": 32, **dict(overrides)})
    model = build(cfg)
    return model, random_params(model, seed, embed_scale)


@pytest.fixture(scope="session")
def tiny():
    """``tiny("tiny-gpt2", position="alibi")`` -> (model, params): vocab 16, max_len 32."""

    def make(name, *, embed_scale=0.2, seed=0, **overrides):
        return _tiny(name, tuple(sorted(overrides.items())), embed_scale, seed)

    return make
