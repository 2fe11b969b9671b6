"""The chunked loss (``train.loss_chunk``) and the padded output projection
(``model.vocab_multiple``) against the plain whole-logits path, the reference.

Tolerances: sums rtol 1e-6 (float32 sums over chunks in another order); gradients within
1e-5 of the largest gradient entry (the same products, accumulated chunk by chunk in the
scan's transpose; measured up to 7e-6 on a tied embedding). Counts (tokens, correct, exact,
sequences) must be equal."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax.config import ModelConfig, TrainConfig
from tfmjax.config.errors import ConfigError
from tfmjax.data import make_batch, make_task
from tfmjax.models import build
from tfmjax.train.loss_sums import batch_sums, chunked_batch_sums
from tfmjax.train.schedules import make_schedule
from tfmjax.train.state import create_state
from tfmjax.train.step import jit_train_step, make_train_step

TASK = make_task("copy", num_symbols=5, max_len=5)
COUNTS = ("tokens", "correct", "exact", "sequences")


def tiny(family, **kw):
    base = dict(family=family, vocab_size=16, d_model=16, num_heads=2, d_ff=32, num_layers=1)
    return ModelConfig(**{**base, **kw})


def noisy_params(model, batch):
    """Init params moved off their init values (norm weights 1, biases 0) by an affine map
    that keeps each leaf's spread: ``1.3 x + 0.05 sin(3 x + 1)``."""
    params = model.init(jax.random.key(0), batch)
    return jax.jit(lambda p: jax.tree.map(lambda x: 1.3 * x + 0.05 * jnp.sin(3 * x + 1), p))(params)


def one_row_right(model, params, batch):
    """``(targets, mask)`` with row 0's targets set to the model's own predictions, so one
    sequence is exact and the exact count can differ between the paths; row 1 masked out."""
    targets, mask = map(jnp.asarray, model.targets_and_mask(batch))
    predictions = jnp.argmax(jax.jit(model.apply)(params, batch), axis=-1)
    targets = targets.at[0].set(predictions[0])
    return targets, mask.at[1].set(0.0)


def assert_close_leaves(got, want):
    """Within 1e-5 of the largest gradient entry: the gradients are sums of the same
    products in another order (chunk by chunk, or with zero columns beside them). The
    scale is the whole gradient's: a key bias's gradient is 0 in exact arithmetic, and its
    float32 noise (~1e-7) differs between the paths."""
    scale = max(float(np.max(np.abs(w))) for w in jax.tree.leaves(want))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * scale)


CASES = [
    ("decoder_only", {}, 0.1),
    ("decoder_only", {"tie_embeddings": False, "output_bias": True, "vocab_multiple": 128}, 0.0),
    ("encoder_decoder", {"tie_embeddings": False}, 0.1),
    ("encoder_only", {"mlm_head": True, "output_bias": True, "vocab_multiple": 24}, 0.0),
]


@pytest.mark.parametrize(("family", "kw", "smoothing"), CASES)
def test_chunked_sums_and_gradients_equal_the_whole_logits(family, kw, smoothing):
    model = build(tiny(family, **kw))
    fmt = "prompt_answer" if family == "encoder_only" else model.batch_format
    batch = make_batch(TASK, batch_format=fmt, batch_size=4, seed=0, step=0)  # its tokens
    batch = {"tokens": batch["tokens"]} if family == "encoder_only" else batch
    params = noisy_params(model, batch)
    if family == "encoder_only":
        targets = batch["tokens"]
        mask = jnp.asarray(np.random.default_rng(0).random(targets.shape) < 0.5, jnp.float32)
    else:
        targets, mask = one_row_right(model, params, batch)
    T = targets.shape[1]

    def whole(p):
        sums = batch_sums(model.apply(p, batch), targets, mask, smoothing)
        return sums["loss_sum"], sums

    def chunked(p, chunk):
        h = model.head_inputs_with_aux(p, batch)[0]
        project = lambda x: model.project_head_inputs(p, x)  # noqa: E731
        sums = chunked_batch_sums(h, project, targets, mask, smoothing, chunk)
        return sums["loss_sum"], sums

    (_, want), want_grads = jax.jit(jax.value_and_grad(whole, has_aux=True))(params)
    chunked_grad = jax.jit(jax.value_and_grad(chunked, has_aux=True), static_argnums=1)
    if family != "encoder_only":
        assert 1 <= want["exact"] < want["sequences"]  # the exact count is exercised
    assert T % 5  # a padded last chunk
    for chunk in (5, T + 3):
        (_, got), grads = chunked_grad(params, chunk)
        for key in COUNTS:
            assert got[key] == want[key], (chunk, key)
        for key in ("loss_sum", "nll_sum"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6)
        assert_close_leaves(grads, want_grads)


def test_a_traced_label_smoothing_chunks_like_a_python_one():
    """The stacked sweep passes the smoothing as a traced per-run array."""
    model = build(tiny("decoder_only"))
    batch = make_batch(TASK, batch_format="prompt_answer", batch_size=2, seed=0, step=0)
    params = noisy_params(model, batch)
    targets, mask = model.targets_and_mask(batch)
    h = model.head_inputs_with_aux(params, batch)[0]
    project = lambda x: model.project_head_inputs(params, x)  # noqa: E731
    for eps in (0.0, 0.2):
        want = batch_sums(model.apply(params, batch), targets, mask, eps)
        got = jax.jit(lambda e: chunked_batch_sums(h, project, targets, mask, e, 4))(
            jnp.float32(eps)
        )
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6)


def test_no_whole_float32_logits_in_the_chunked_gradient():
    """The point of the chunks: the compiled gradient holds no float32 array of B*T*V
    elements or more (the plain path's logits, their softmax and cotangent have one)."""
    cfg = tiny("decoder_only", vocab_size=512, tie_embeddings=True)
    model = build(cfg)
    batch = make_batch(TASK, batch_format="prompt_answer", batch_size=8, seed=0, step=0)
    params = model.init(jax.random.key(0), batch)
    targets, mask = model.targets_and_mask(batch)
    B, T = targets.shape

    def loss(p, chunk):
        if not chunk:
            return batch_sums(model.apply(p, batch), targets, mask, 0.0)["loss_sum"]
        h = model.head_inputs_with_aux(p, batch)[0]
        project = lambda x: model.project_head_inputs(p, x)  # noqa: E731
        return chunked_batch_sums(h, project, targets, mask, 0.0, chunk)["loss_sum"]

    def largest_f32(chunk) -> int:
        hlo = jax.jit(jax.grad(loss), static_argnums=1).lower(params, chunk).compile().as_text()
        sizes = [np.prod([int(d) for d in dims.split(",") if d]) for dims in F32.findall(hlo)]
        return max(sizes)

    assert largest_f32(0) >= B * T * cfg.vocab_size
    assert largest_f32(2) < B * T * cfg.vocab_size
    assert largest_f32(2) <= B * 2 * cfg.vocab_size


F32 = re.compile(r"f32\[([0-9,]*)\]")


@pytest.mark.parametrize("tie", [True, False])
def test_padded_vocabulary_gives_the_same_logits_and_gradients(tie):
    """``vocab_multiple`` pads the projection's columns with zeros and cuts them off: the
    params keep V (checkpoints and exports unchanged), the logits are V wide and equal the
    unpadded model's, and so are the gradients."""
    plain = build(tiny("decoder_only", tie_embeddings=tie, output_bias=True, vocab_size=20))
    padded = build(dataclasses.replace(plain.config, vocab_multiple=128))
    assert padded.config.projected_vocab == 128
    batch = make_batch(TASK, batch_format="prompt_answer", batch_size=2, seed=0, step=0)
    params = noisy_params(plain, batch)
    padded_params = padded.init(jax.random.key(0), batch)
    shapes = lambda p: jax.tree.map(jnp.shape, p)  # noqa: E731
    assert shapes(padded_params) == shapes(params)
    logits = padded.apply(params, batch)
    assert logits.shape[-1] == 20
    np.testing.assert_allclose(logits, plain.apply(params, batch), rtol=1e-6, atol=1e-6)
    grad = lambda m: jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(m.apply(p, batch)))))(params)  # noqa: E731
    assert_close_leaves(grad(padded), grad(plain))


def test_a_train_step_with_a_chunked_loss_matches_the_plain_one():
    """SGD, not Adam: Adam turns the float32 noise of a gradient that is zero in exact
    arithmetic (a key bias) into a full-size step of either sign."""
    cfg = tiny("encoder_decoder", tie_embeddings=False, vocab_multiple=32)
    schedule = make_schedule("constant", peak_lr=0.1, warmup_steps=0, total_steps=4, d_model=16)
    tx = optax.sgd(schedule)
    model = build(cfg)
    batch = make_batch(TASK, batch_format=model.batch_format, batch_size=8, seed=0, step=0)
    results = []
    for chunk in (0, 3):
        state = create_state(model, tx, batch, seed=0)
        step = jit_train_step(make_train_step(build(cfg), tx, schedule, loss_chunk=chunk))
        for _ in range(2):
            state, metrics = step(state, batch)
        results.append((state.params, metrics))
    (want_params, want), (got_params, got) = results
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-6)


def test_bad_values_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="train.loss_chunk"):
        TrainConfig(loss_chunk=-1)
    with pytest.raises(ConfigError, match="model.vocab_multiple"):
        ModelConfig(vocab_multiple=0)
