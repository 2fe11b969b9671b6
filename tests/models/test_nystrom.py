"""Nyström attention (``model.attention = "nystrom"``) in whole models: bidirectional only, so
a decoder_only model refuses it and an encoder_decoder's decoder keeps softmax; options that
do not apply are refused in one line naming the field; padding never changes real outputs;
an encoder_only model trains. (Cached decoding of an encoder-decoder: tests/decode.)"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import config as C
from tfmjax.models import build, preset
from tfmjax.train.optimizer import make_optimizer
from tfmjax.train.schedules import make_schedule
from tfmjax.train.state import create_state
from tfmjax.train.step import jit_train_step, make_train_step

TINY = dict(vocab_size=32, d_model=32, num_heads=4, d_ff=64, num_layers=1, max_len=32)

REFUSED = [
    ({"family": "decoder_only"}, "model.attention='nystrom' is invalid: .*bidirectional only"),
    ({"position": "alibi"}, "model.position='alibi' is invalid: model.attention='nystrom' has"),
    ({"position": "relative"}, "model.position='relative' is invalid"),
    ({"window": 4}, "model.window=4 is invalid: sparse patterns apply to softmax and mla"),
    ({"attention_stride": 2}, "model.attention_stride=2 is invalid: sparse patterns"),
    ({"global_tokens": 1}, "model.global_tokens=1 is invalid: sparse patterns"),
    ({"attention_impl": "xla"}, "model.attention_impl='xla' is invalid: picks a softmax"),
    ({"num_landmarks": 0}, "model.num_landmarks=0 is invalid: must be > 0"),
    ({"num_kv_heads": 3}, "model.num_heads=4 is invalid: must be divisible"),
    ({"nystrom_conv": 4}, "model.nystrom_conv=4 is invalid: must be 0 .none. or an odd width"),
]


@pytest.mark.parametrize("fields,message", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_options_that_do_not_apply_are_refused_in_one_line(fields, message):
    base = dict(family="encoder_only", attention="nystrom")
    with pytest.raises(C.ConfigError, match=message) as err:
        C.ModelConfig(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_num_landmarks_applies_to_nystrom_only():
    C.ModelConfig(family="encoder_decoder", attention="nystrom", attention_impl="xla")
    with pytest.raises(C.ConfigError, match="model.num_landmarks=4 is invalid: applies to"):
        C.ModelConfig(family="encoder_only", num_landmarks=4)
    with pytest.raises(C.ConfigError, match="model.nystrom_conv=3 is invalid: applies to"):
        C.ModelConfig(family="encoder_only", nystrom_conv=3)


def test_encoder_decoder_keeps_softmax_in_the_decoder():
    """The encoder's attention is Nyström (its output differs from softmax's with the same
    parameters); the decoder's self- and cross-attention stay softmax, with a KV cache."""
    cfg = preset("tiny-vaswani", attention="nystrom", num_landmarks=2, **TINY)
    twin = preset("tiny-vaswani", **TINY)
    batch = {"inputs": jnp.arange(3, 11)[None], "targets": jnp.arange(3, 8)[None]}
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), batch)
    assert set(params["params"]["decoder"]["layers"]["attention"]) == {
        "query",
        "key",
        "value",
        "out",
    }
    cache = model.init_cache(batch=1, capacity=4)
    assert jax.tree.leaves(cache) and model.kv_cache_bytes(1, 4) > 0
    nystrom, softmax = (jax.jit(build(c).apply)(params, batch) for c in (cfg, twin))
    assert np.all(np.isfinite(nystrom))
    assert not np.allclose(nystrom, softmax, atol=1e-4)


@pytest.mark.parametrize("conv", [0, 5])
def test_padding_never_changes_real_outputs(conv):
    """An encoder_only model: a row padded with any ids gives its real tokens the logits of
    the unpadded row (padding enters neither landmarks nor keys, nor the skip convolution)."""
    cfg = preset("tiny-nystrom", num_landmarks=3, nystrom_conv=conv, **TINY)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(5, 32, (2, 7)), jnp.int32)
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), {"tokens": tokens})
    attention = params["params"]["encoder"]["layers"]["attention"]
    assert ("conv_kernel" in attention) == bool(conv)
    apply = jax.jit(model.apply)
    plain = apply(params, {"tokens": tokens})
    for filler in (0, 9):
        padded = jnp.concatenate([tokens, jnp.full((2, 4), filler, jnp.int32)], axis=1)
        segment_ids = jnp.concatenate(
            [jnp.ones((2, 7), jnp.int32), jnp.zeros((2, 4), jnp.int32)], 1
        )
        out = apply(params, {"tokens": padded, "segment_ids": segment_ids})
        np.testing.assert_allclose(out[:, :7], plain, rtol=1e-5, atol=1e-5)


def masked_lm_batch(step: int, rows: int = 8, length: int = 16) -> dict:
    """Random ids, 15% of them replaced by id 3 and scored; half the rows padded by 5."""
    rng = np.random.default_rng(step)
    targets = rng.integers(5, 32, (rows, length)).astype(np.int32)
    segment_ids = np.ones((rows, length), np.int32)
    segment_ids[::2, -5:] = 0
    picked = (rng.random((rows, length)) < 0.15) & (segment_ids == 1)
    tokens = np.where(picked, 3, np.where(segment_ids == 1, targets, 0)).astype(np.int32)
    return dict(
        tokens=tokens, targets=targets, loss_mask=picked.astype(np.float32), segment_ids=segment_ids
    )


def test_encoder_only_model_trains_a_few_steps():
    """Five train steps of tiny-nystrom on masked-LM batches with padding: the loss stays
    finite (whether it falls in five steps is not asked)."""
    cfg = preset("tiny-nystrom", num_landmarks=4, **TINY)
    schedule = make_schedule("constant", peak_lr=1e-2, warmup_steps=0, total_steps=5, d_model=32)
    tx = make_optimizer(schedule=schedule, clip_norm=1.0)
    state = create_state(build(cfg), tx, masked_lm_batch(0), seed=0)
    step = jit_train_step(make_train_step(build(cfg, deterministic=False), tx, schedule))
    losses = []
    for s in range(5):
        state, metrics = step(state, masked_lm_batch(s))
        losses.append(float(metrics["loss"]))
    assert all(math.isfinite(x) and x > 0 for x in losses), losses
