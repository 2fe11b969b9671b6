"""Tiny models for the interpretability tests: random params (drawn on the host, see
``tests/random_params.py``) and, for what needs learned structure, a few hundred steps of
training on ``reverse``."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax.data.batching import make_batch
from tfmjax.data.tasks import make_task
from tfmjax.losses import cross_entropy
from tfmjax.models import build, preset

FAMILY_PRESET = {"decoder_only": "tiny-gpt2", "encoder_decoder": "tiny-vaswani"}


@functools.cache
def _tiny(random_params, family: str, overrides: tuple, seed: int):
    base = {"vocab_size": 16, "max_len": 24, "norm_position": "pre", "num_layers": 2}
    cfg = preset(FAMILY_PRESET[family], **{**base, **dict(overrides)})
    model = build(cfg)
    return model, random_params(model, seed)


@pytest.fixture(scope="session")
def tiny(random_params):
    """``tiny("decoder_only", position="alibi")`` -> (model, params), pre-norm, 2 layers."""

    def make(family, *, seed=0, **overrides):
        return _tiny(random_params, family, tuple(sorted(overrides.items())), seed)

    return make


def token_batch(model, seed: int = 0, batch: int = 3, length: int = 7) -> dict:
    """Random task-symbol rows for every token key of the family, ``[batch, length]``."""
    rng = np.random.default_rng(seed)
    return {
        key: jnp.asarray(rng.integers(5, model.config.vocab_size, (batch, length)), jnp.int32)
        for key in model.token_keys
    }


@pytest.fixture(scope="session")
def rows():
    """``rows(model, seed=0, batch=3, length=7)``: see :func:`token_batch`."""
    return token_batch


@functools.cache
def _trained(random_params, family: str, steps: int = 400):
    task = make_task("reverse", max_len=5, num_symbols=6)
    cfg = preset(
        FAMILY_PRESET[family],
        vocab_size=task.vocab.size,
        max_len=16,
        num_layers=2,
        norm_position="pre",
    )
    model = build(cfg)
    params = random_params(model, 0)
    tx = optax.adam(3e-3)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            targets, mask = model.targets_and_mask(batch)
            total, weight = cross_entropy(model.apply(p, batch), targets, mask)
            return total / weight

        grads = jax.grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def batch_at(i, split="train"):
        raw = make_batch(
            task, batch_format=model.batch_format, batch_size=32, seed=0, step=i, split=split
        )
        return {k: jnp.asarray(v) for k, v in raw.items()}

    for i in range(steps):
        params, opt_state = step(params, opt_state, batch_at(i))
    return task, model, params, batch_at(0, "eval")


@pytest.fixture(scope="session")
def trained(random_params):
    """``trained(family)`` -> (task, model, params, eval batch): reverse, 400 steps."""
    return functools.partial(_trained, random_params)


@pytest.fixture
def hooks_off(monkeypatch):
    """``hooks_off(*module names)``: each module's ``hook``, ``wanted`` and ``edited`` (and
    ``tfmjax.layers.hooks``'s) made an identity / False, as if the model had no hooks."""

    def switch(*names):
        for name in ("tfmjax.layers.hooks", *names):
            module = importlib.import_module(name)
            for attr, off in (
                ("hook", lambda m, n, x: x),
                ("wanted", lambda m, n: False),
                ("edited", lambda m, n: False),
            ):
                if hasattr(module, attr):
                    monkeypatch.setattr(module, attr, off)

    return switch
