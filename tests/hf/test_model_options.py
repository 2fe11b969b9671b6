"""The model options the Hugging Face architectures need, checked without Hugging Face."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.config import ACTIVATIONS, ConfigError, ModelConfig, preset
from tfmjax.hf.mapping import flatten
from tfmjax.layers.mlp import GATED, PLAIN
from tfmjax.layers.positions import apply_rope, sinusoidal
from tfmjax.models import build

H = 8
TO_HALF = np.concatenate([np.arange(0, H, 2), np.arange(1, H, 2)])  # interleaved -> half


def init(random_params, cfg: ModelConfig):
    """The model, random params (drawn on the host: no compile of ``model.init``) and a batch."""
    model = build(cfg)
    return model, random_params(model), model.dummy_batch(2, 6)


def test_activations_are_the_configs_activations():
    assert set(PLAIN) | set(GATED) == set(ACTIVATIONS)


def test_half_split_rope_is_interleaved_rope_on_permuted_features():
    x = jax.random.normal(jax.random.key(1), (2, 5, 3, H))
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    interleaved = apply_rope(x, positions, 100.0)
    half = apply_rope(x[..., TO_HALF], positions, 100.0, "half_split")
    np.testing.assert_allclose(half, interleaved[..., TO_HALF], atol=1e-6)


def test_half_split_sinusoidal_is_interleaved_reordered():
    positions = jnp.arange(7)[None]
    np.testing.assert_array_equal(
        sinusoidal(positions, H, layout="half_split"), sinusoidal(positions, H)[..., TO_HALF]
    )


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-bert", "tiny-vaswani"])
def test_defaults_add_no_parameters(random_params, name):
    _, params, _ = init(random_params, preset(name))
    paths = " ".join(flatten(params["params"]))
    for new in ("type_embed", "embed_norm", "decoder_pos_embed", "mlm_", "output_bias"):
        assert new not in paths


def test_attention_and_mlp_biases_are_separate_switches(random_params):
    _, params, _ = init(random_params, preset("tiny-llama", attention_bias=True))
    paths = set(flatten(params["params"]))
    assert "decoder/layers/attention/query/bias" in paths
    assert not any(p.startswith("decoder/layers/mlp/") and p.endswith("bias") for p in paths)
    _, params, _ = init(random_params, preset("tiny-gpt2", mlp_bias=False))
    paths = set(flatten(params["params"]))
    assert (
        "decoder/layers/attention/out/bias" in paths and "decoder/layers/mlp/up/bias" not in paths
    )


def test_unscaled_attention_equals_a_query_scaled_by_sqrt_h(random_params):
    cfg = preset("tiny-gpt2", scale_attention=False)
    model, params, batch = init(random_params, cfg)
    scaled = jax.tree_util.tree_map_with_path(
        lambda path, p: p * cfg.head_width**0.5 if "query" in jax.tree_util.keystr(path) else p,
        params,
    )
    want = jax.jit(build(dataclasses.replace(cfg, scale_attention=True)).apply)(scaled, batch)
    np.testing.assert_allclose(jax.jit(model.apply)(params, batch), want, atol=1e-5)


def test_scaled_tied_output_scales_the_logits(random_params):
    cfg = preset("tiny-gpt2", scale_tied_output=True)
    model, params, batch = init(random_params, cfg)
    plain = jax.jit(build(dataclasses.replace(cfg, scale_tied_output=False)).apply)(params, batch)
    np.testing.assert_allclose(
        jax.jit(model.apply)(params, batch), plain * cfg.d_model**-0.5, atol=1e-6
    )


def test_position_offset_reads_the_table_from_that_row(random_params):
    cfg = preset("tiny-gpt2", position_offset=2, max_len=16)
    model, params, batch = init(random_params, cfg)
    table = params["params"]["embed"]["pos_embed"]["pos_embedding"]
    assert table.shape == (18, cfg.d_model)
    plain = dataclasses.replace(cfg, position_offset=0)
    params0 = jax.tree.map(lambda x: x, params)
    params0["params"]["embed"]["pos_embed"]["pos_embedding"] = table[2:]
    np.testing.assert_allclose(
        jax.jit(model.apply)(params, batch), jax.jit(build(plain).apply)(params0, batch)
    )


def test_bert_options_token_types_and_mlm_head(random_params):
    cfg = preset("tiny-bert", type_vocab_size=2, embed_norm=True, mlm_head=True, output_bias=True)
    model, params, batch = init(random_params, cfg)
    types = jnp.ones_like(batch["tokens"])
    a = jax.jit(model.apply)(params, batch)
    b = jax.jit(model.apply)(params, dict(batch, token_types=types))
    assert a.shape == b.shape and not np.allclose(a, b)
    assert set(params["params"]["head"]) == {"mlm_dense", "mlm_norm", "output_bias"}


def test_per_side_embeddings_give_the_decoder_its_own_table(random_params):
    cfg = preset("tiny-vaswani", position="learned", per_side_embeddings=True, embed_norm=True)
    _, params, _ = init(random_params, cfg)
    assert {"pos_embed", "decoder_pos_embed", "embed_norm", "decoder_embed_norm"} <= set(
        params["params"]["embed"]
    )


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(rope_layout="rotate"), "model.rope_layout='rotate' is invalid"),
        (dict(sinusoidal_layout="x"), "model.sinusoidal_layout='x' is invalid"),
        (dict(per_side_embeddings=True), "model.per_side_embeddings=True is invalid"),
        (dict(mlm_head=True, activation="swiglu"), "model.mlm_head=True is invalid"),
        (dict(position_offset=-1), "model.position_offset=-1 is invalid"),
        (dict(type_vocab_size=-2), "model.type_vocab_size=-2 is invalid"),
        (dict(attention_bias="yes"), "model.attention_bias='yes' is invalid"),
    ],
)
def test_new_options_are_validated_in_one_line(fields, match):
    with pytest.raises(ConfigError, match=match):
        preset("tiny-gpt2", **fields)
