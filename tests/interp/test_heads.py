"""Head scores on repeated random sequences: each score reads the offset it names."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.interp import head_scores
from tfmjax.interp.heads import repeated_batch, scores_from_patterns


def _pattern_at(offset: int, T: int):
    """A causal pattern attending ``offset`` back (to BOS where that is before the start)."""
    rows = np.zeros((T, T), np.float32)
    for t in range(T):
        rows[t, max(t - offset, 0)] = 1.0
    return rows


@pytest.mark.parametrize("shift", [0, 1])
def test_each_score_reads_its_offset(shift):
    n = 5
    T = 2 * n + (0 if shift else 0)
    heads = np.stack([_pattern_at(d, T) for d in (1, n, n - 1, 2)])  # [N,T,T]
    patterns = jnp.asarray(heads)[None, None]  # [L=1,B=1,N,T,T]
    scores = scores_from_patterns(patterns, n, shift)
    np.testing.assert_allclose(scores["previous_token"][0], [1, 0, 0, 0])
    np.testing.assert_allclose(scores["duplicate_token"][0], [0, 1, 0, 0])
    np.testing.assert_allclose(scores["induction"][0], [0, 0, 1, 0])


def test_repeated_batch_and_scores_of_a_model(tiny):
    model, params = tiny("encoder_decoder")
    batch = repeated_batch(model, jax.random.PRNGKey(0), 4, 6, high=11)
    for key in ("inputs", "targets"):
        ids = np.asarray(batch[key])
        np.testing.assert_array_equal(ids[:, :6], ids[:, 6:])
        assert ids.min() >= 5 and ids.max() < 11
    for stack in ("encoder", "decoder"):
        scores = head_scores(model, params, jax.random.PRNGKey(0), length=6, stack=stack)
        for value in scores.values():
            assert value.shape == (2, model.config.num_heads)
            assert float(value.min()) >= 0.0 and float(value.max()) <= 1.0
    with pytest.raises(ValueError, match="does not fit model.max_len"):
        head_scores(model, params, jax.random.PRNGKey(0), length=100)
