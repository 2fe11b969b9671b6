"""``Family.init``: one trace per distinct model, reused by any equal model."""

import jax
import numpy as np

from tfmjax.config import ModelConfig
from tfmjax.models import build, family


def test_an_equal_model_reuses_the_traced_init_and_a_different_one_does_not(monkeypatch):
    traces = []
    real = family._model_variables

    def counted(*args, **kwargs):
        traces.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(family, "_model_variables", counted)
    # Sizes no other test uses, so no earlier test of this worker traced this model.
    config = dict(family="decoder_only", vocab_size=19, d_model=12, num_heads=2, d_ff=20)
    key = jax.random.key(3)
    first = build(ModelConfig(**config, num_layers=1))
    params = first.init(key, first.dummy_batch())
    assert len(traces) == 1
    again = build(ModelConfig(**config, num_layers=1))  # built anew: equal, not identical
    same = again.init(key, again.dummy_batch())
    assert len(traces) == 1
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(same), strict=True):
        np.testing.assert_array_equal(a, b)
    deeper = build(ModelConfig(**config, num_layers=2))
    jax.eval_shape(deeper.init, key, deeper.dummy_batch())  # traces without compiling
    assert len(traces) == 2
