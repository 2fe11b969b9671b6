"""Invariances every family must keep: causality, padding, permutation equivariance, scan."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.stack import unstack_params
from tfmjax.models import build, preset

FAMILY_PRESETS = {
    "encoder_decoder": "tiny-vaswani",
    "decoder_only": "tiny-gpt2",
    "encoder_only": "tiny-bert",
}
POSITIONS = ["sinusoidal", "learned", "rope", "alibi", "relative", "fire"]


def _cfg(family, **kw):
    return preset(FAMILY_PRESETS[family], **{"num_layers": 2, **kw})


def _tokens(shape, seed=0, low=5, high=32):
    return jnp.asarray(np.random.default_rng(seed).integers(low, high, shape), jnp.int32)


def _batch(family, tokens, inputs=None):
    if family == "encoder_decoder":
        return {
            "inputs": _tokens((tokens.shape[0], 6), 7) if inputs is None else inputs,
            "targets": tokens,
        }
    return {"tokens": tokens}


def _init_apply(random_params, cfg, batch):
    """The model's jitted apply (a compiled program runs these small models several times
    faster than op-by-op dispatch; the values are the same), random params (each invariance
    holds for any params; ``model.init``'s own draws would cost a compile each) and its
    logits."""
    model = build(cfg)
    params = random_params(model)
    apply = jax.jit(model.apply)
    return apply, params, apply(params, batch)


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("position", POSITIONS)
def test_future_tokens_never_change_earlier_logits(random_params, family, position):
    cfg = _cfg(family, position=position, norm_position="pre")
    tokens = _tokens((2, 8))
    apply, params, logits = _init_apply(random_params, cfg, _batch(family, tokens))
    changed = tokens.at[:, 5:].set(_tokens((2, 3), seed=3))
    new_logits = apply(params, _batch(family, changed))
    # logits[t] predicts token t from tokens < t: positions 0..5 see only tokens 0..4.
    np.testing.assert_allclose(new_logits[:, :6], logits[:, :6], rtol=1e-5, atol=1e-5)
    assert not np.allclose(new_logits[:, 6:], logits[:, 6:], atol=1e-3)


@pytest.mark.parametrize("family", list(FAMILY_PRESETS))
@pytest.mark.parametrize("position", POSITIONS)
def test_padding_never_changes_real_outputs(random_params, family, position):
    cfg = _cfg(family, position=position)
    tokens = _tokens((2, 6))
    padded = jnp.concatenate([tokens, jnp.zeros((2, 3), jnp.int32)], axis=1)
    if family == "encoder_decoder":
        inputs = _tokens((2, 5), 7)
        a_batch = {"inputs": inputs, "targets": tokens}
        b_batch = {
            "inputs": jnp.concatenate([inputs, jnp.zeros((2, 4), jnp.int32)], 1),
            "targets": padded,
        }
    else:
        a_batch, b_batch = {"tokens": tokens}, {"tokens": padded}
    apply, params, logits = _init_apply(random_params, cfg, a_batch)
    np.testing.assert_allclose(apply(params, b_batch)[:, :6], logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["encoder_only", "encoder_decoder"])
def test_self_attention_without_positions_is_permutation_equivariant(random_params, family):
    # Attention is permutation-equivariant: Attention(P X) = P Attention(X) when nothing
    # encodes position.
    cfg = _cfg(family, position="none")
    tokens = _tokens((2, 7))
    perm = np.random.default_rng(0).permutation(7)
    if family == "encoder_only":
        apply, params, logits = _init_apply(random_params, cfg, {"tokens": tokens})
        permuted = apply(params, {"tokens": tokens[:, perm]})
        np.testing.assert_allclose(permuted, logits[:, perm], rtol=1e-5, atol=1e-5)
    else:  # the decoder's output never depends on the order of the encoder's inputs
        targets = _tokens((2, 4), 3)
        apply, params, logits = _init_apply(
            random_params, cfg, {"inputs": tokens, "targets": targets}
        )
        permuted = apply(params, {"inputs": tokens[:, perm], "targets": targets})
        np.testing.assert_allclose(permuted, logits, rtol=1e-5, atol=1e-5)


def test_positions_break_permutation_equivariance(random_params):
    cfg = _cfg("encoder_only", position="sinusoidal")
    tokens = _tokens((1, 7))
    apply, params, logits = _init_apply(random_params, cfg, {"tokens": tokens})
    perm = np.arange(7)[::-1]
    assert not np.allclose(apply(params, {"tokens": tokens[:, perm]}), logits[:, perm], atol=1e-3)


@pytest.mark.parametrize("family", list(FAMILY_PRESETS))
@pytest.mark.parametrize("remat", [False, True])
def test_scanned_equals_unrolled(random_params, family, remat):
    cfg = _cfg(family, position="rope", remat=remat, num_layers=3)
    batch = _batch(family, _tokens((2, 6)))
    _, params, logits = _init_apply(random_params, cfg, batch)
    unrolled = build(dataclasses.replace(cfg, scan_layers=False))
    p = jax.tree.map(lambda x: x, params["params"])
    for stack in ("encoder", "decoder"):
        if stack in p:
            layers = cfg.num_layers
            p[stack] = unstack_params(p[stack], layers)
    np.testing.assert_allclose(
        jax.jit(unrolled.apply)({"params": p}, batch), logits, rtol=1e-5, atol=1e-5
    )
    # and the unrolled model's own init has exactly that layout
    own = jax.eval_shape(unrolled.init, jax.random.key(0), batch)["params"]
    assert jax.tree.structure(own) == jax.tree.structure(p)


@pytest.mark.slow
def test_packed_segments_equal_separate_rows(random_params):
    cfg = _cfg("decoder_only", position="rope")
    a, b = _tokens((1, 4), 1), _tokens((1, 3), 2)
    model = build(cfg)
    params = random_params(model)
    apply = jax.jit(model.apply)
    packed = {
        "tokens": jnp.concatenate([a, b, jnp.zeros((1, 1), jnp.int32)], 1),
        "segment_ids": jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]]),
    }
    logits = apply(params, packed)
    np.testing.assert_allclose(logits[:, :4], apply(params, {"tokens": a}), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits[:, 4:7], apply(params, {"tokens": b}), rtol=1e-5, atol=1e-5)


def test_tied_and_untied_heads():
    tokens = _tokens((1, 4))
    tied = jax.eval_shape(build(_cfg("decoder_only")).init, jax.random.key(0), {"tokens": tokens})
    untied = jax.eval_shape(
        build(_cfg("decoder_only", tie_embeddings=False)).init,
        jax.random.key(0),
        {"tokens": tokens},
    )
    assert "lm_head" not in tied["params"]["head"]
    assert untied["params"]["head"]["lm_head"]["kernel"].shape == (64, 32)


def test_dropout_is_active_only_when_training(random_params):
    """Training: two dropout keys give two outputs. Eval (``deterministic=True``): the output
    ignores the dropout key, and equals the same params' output with ``dropout_rate=0``."""
    cfg = _cfg("decoder_only", dropout_rate=0.5)
    batch = {"tokens": _tokens((2, 6))}
    params = random_params(build(cfg))
    train = jax.jit(build(cfg, deterministic=False).apply)
    a = train(params, batch, rngs={"dropout": jax.random.key(1)})
    b = train(params, batch, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(a, b, atol=1e-3)
    evaluate = jax.jit(build(cfg).apply)
    c = evaluate(params, batch, rngs={"dropout": jax.random.key(1)})
    d = evaluate(params, batch, rngs={"dropout": jax.random.key(2)})
    np.testing.assert_array_equal(c, d)
    no_dropout = build(dataclasses.replace(cfg, dropout_rate=0.0), deterministic=False)
    np.testing.assert_allclose(
        c,
        no_dropout.apply(params, batch, rngs={"dropout": jax.random.key(1)}),
        rtol=1e-6,
        atol=1e-6,
    )
    assert not np.allclose(a, c, atol=1e-3)  # and the training outputs are not the eval one
