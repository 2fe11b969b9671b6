"""BigBird's random blocks (``model.random_blocks``, Zaheer et al. 2020) in whole models: they
reach keys the window does not (and nothing before the first random draw changes); padding
never changes real outputs of the bidirectional encoder; the preset builds. The masks and
kernels against the oracle: tests/kernels/test_sparse_patterns.py and test_oracle.py; cached
decoding: tests/decode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.models import build, preset

TINY = dict(vocab_size=32, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=32)


def test_random_blocks_reach_past_the_window():
    """Same parameters, window 1 with and without one random block of 4 per query block: the
    causal draw of block 0 is empty, so positions 0..3 agree; later positions see a random
    block the window does not reach, so some of their logits differ."""
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 32, (2, 24)), jnp.int32)
    windowed = build(preset("tiny-gpt2", window=1, **TINY))
    bigbird = build(preset("tiny-gpt2", window=1, random_blocks=1, random_block_size=4, **TINY))
    params = jax.jit(windowed.init)(jax.random.key(0), {"tokens": tokens})
    plain = np.asarray(jax.jit(windowed.apply)(params, {"tokens": tokens}))
    random = np.asarray(jax.jit(bigbird.apply)(params, {"tokens": tokens}))
    np.testing.assert_allclose(random[:, :4], plain[:, :4], rtol=1e-6, atol=1e-6)
    assert not np.allclose(random[:, 8:], plain[:, 8:], atol=1e-3)


def test_padding_never_changes_real_outputs_of_the_encoder():
    """tiny-bigbird (bidirectional: draws range over the blocks of max_len): a row padded
    with any ids gives its real tokens the logits of the unpadded row, as random blocks that
    fall on padding are masked by the segment ids."""
    cfg = preset("tiny-bigbird", **dict(TINY, max_len=64))
    assert cfg.family == "encoder_only" and cfg.random_blocks == 2
    tokens = jnp.asarray(np.random.default_rng(1).integers(5, 32, (2, 40)), jnp.int32)
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), {"tokens": tokens})
    apply = jax.jit(model.apply)
    plain = apply(params, {"tokens": tokens})
    for filler in (0, 9):
        padded = jnp.concatenate([tokens, jnp.full((2, 24), filler, jnp.int32)], axis=1)
        segment_ids = jnp.concatenate(
            [jnp.ones((2, 40), jnp.int32), jnp.zeros((2, 24), jnp.int32)], 1
        )
        out = apply(params, {"tokens": padded, "segment_ids": segment_ids})
        np.testing.assert_allclose(out[:, :40], plain, rtol=1e-5, atol=1e-5)
