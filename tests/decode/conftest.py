"""Shared tiny models for the decoding tests.

Parameters are drawn on the host with NumPy into the shapes ``jax.eval_shape(model.init)``
reports: compiling ``model.init`` per config would cost more than the test itself. Values are
scaled so a random model's next-token distributions are spread out (a tied N(0, 1) embedding
makes it repeat its input with probability ~1), which is what decoding tests need.
"""

import functools

import pytest

from tfmjax.models import build, preset


@functools.cache
def _tiny(random_params, name: str, overrides: tuple, embed_scale: float, seed: int):
    cfg = preset(name, **{"vocab_size": 16, "max_len": 32, **dict(overrides)})
    model = build(cfg)
    return model, random_params(model, seed, embed_scale)


@pytest.fixture(scope="session")
def tiny(random_params):
    """``tiny("tiny-gpt2", position="alibi")`` -> (model, params): vocab 16, max_len 32."""

    def make(name, *, embed_scale=0.2, seed=0, **overrides):
        return _tiny(random_params, name, tuple(sorted(overrides.items())), embed_scale, seed)

    return make
