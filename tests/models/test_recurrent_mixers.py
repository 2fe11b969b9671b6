"""The recurrent self-mixers in whole models: ``model.attention = "retention"`` (RetNet),
``"selective_scan"`` (Mamba) and ``"rwkv"`` (RWKV-4, with its channel-mix). Options that do
not apply are refused in one line naming the field; decoder-only and encoder-decoder models
are causal (a future token never changes an earlier logit) and padding never changes real
outputs; an encoder-decoder's encoder keeps softmax self-attention. (Cached decoding == the
uncached forward: tests/decode.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import config as C
from tfmjax.models import build, preset

MIXERS = ["retention", "selective_scan", "rwkv"]
# rwkv brings its channel-mix (squared ReLU) as the feed-forward: the presets' GELU is refused.
EXTRA = {"rwkv": {"activation": "relu"}}

REFUSED = [
    ({"family": "encoder_only"}, "model.attention='{m}' is invalid: .*causal only"),
    ({"position": "alibi"}, "model.position='alibi' is invalid: model.attention='{m}' cannot"),
    ({"position": "fire"}, "model.position='fire' is invalid"),
    ({"window": 4}, "model.window=4 is invalid: sparse patterns apply to softmax and mla"),
    ({"random_blocks": 1}, "model.random_blocks=1 is invalid: sparse patterns apply to softmax"),
    ({"attention_stride": 2}, "model.attention_stride=2 is invalid: sparse patterns"),
    ({"global_tokens": 1}, "model.global_tokens=1 is invalid: sparse patterns"),
    ({"num_kv_heads": 1}, "model.num_kv_heads=1 is invalid"),
    ({"attention_impl": "pallas"}, "model.attention_impl='pallas' is invalid: picks a softmax"),
]


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("fields,message", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_options_that_do_not_apply_are_refused_in_one_line(mixer, fields, message):
    base = dict(family="decoder_only", position="none", attention=mixer)
    with pytest.raises(C.ConfigError, match=message.format(m=mixer)) as err:
        C.ModelConfig(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_rope_is_retentions_rotation_but_not_the_scans():
    C.ModelConfig(family="decoder_only", attention="retention", position="rope")
    with pytest.raises(C.ConfigError, match="model.position='rope' is invalid"):
        C.ModelConfig(family="decoder_only", attention="selective_scan", position="rope")


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"position": "rope"}, "model.position='rope' is invalid: model.attention='rwkv' cannot"),
        ({"activation": "gelu"}, "model.activation='gelu' is invalid: .*channel-mix"),
        ({"activation": "swiglu"}, "model.activation='swiglu' is invalid: .*set 'relu'"),
        ({"moe_experts": 4}, "model.moe_experts=4 is invalid: .*channel-mix .*not a mixture"),
        ({"position_sampling": "randomized"}, "model.position_sampling='randomized' is invalid"),
    ],
)
def test_rwkv_refuses_another_feed_forward_and_rope_in_one_line(fields, message):
    base = dict(family="decoder_only", position="learned", attention="rwkv")
    with pytest.raises(C.ConfigError, match=message) as err:
        C.ModelConfig(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_rwkv_blocks_take_the_channel_mix_and_an_encoder_keeps_the_feed_forward():
    cfg = preset("tiny-vaswani", attention="rwkv", activation="relu", num_layers=1)
    batch = {"inputs": jnp.ones((1, 4), jnp.int32), "targets": jnp.ones((1, 3), jnp.int32)}
    params = jax.eval_shape(build(cfg).init, jax.random.key(0), batch)["params"]
    mix = {"key", "receptance", "value", "time_mix_k", "time_mix_r"}
    assert set(params["decoder"]["layers"]["mlp"]) == mix
    assert set(params["encoder"]["layers"]["mlp"]) == {"up", "down"}


def test_ssm_fields_apply_to_the_selective_scan_only():
    C.ModelConfig(attention="selective_scan", family="decoder_only", position="none", ssm_state=8)
    with pytest.raises(C.ConfigError, match="model.ssm_state=8 is invalid: applies to selective"):
        C.ModelConfig(attention="retention", family="decoder_only", ssm_state=8)
    with pytest.raises(C.ConfigError, match="model.ssm_conv=0 is invalid: must be > 0"):
        C.ModelConfig(attention="selective_scan", family="decoder_only", ssm_conv=0)


def test_encoder_decoder_keeps_softmax_in_the_encoder_and_cross_attention():
    """A softmax attention_impl still applies there, so it is not refused."""
    for mixer in MIXERS:
        cfg = preset(
            "tiny-vaswani",
            attention=mixer,
            num_layers=1,
            attention_impl="xla",
            **EXTRA.get(mixer, {}),
        )
        batch = {"inputs": jnp.ones((1, 4), jnp.int32), "targets": jnp.ones((1, 3), jnp.int32)}
        params = jax.eval_shape(build(cfg).init, jax.random.key(0), batch)["params"]
        assert set(params["encoder"]["layers"]["attention"]) == {"query", "key", "value", "out"}
        assert set(params["decoder"]["layers"]["cross_attention"]) == {
            "query",
            "key",
            "value",
            "out",
        }
        assert set(params["decoder"]["layers"]["attention"]) != {"query", "key", "value", "out"}


def _batch(family, tokens, inputs):
    return (
        {"inputs": inputs, "targets": tokens} if family == "encoder_decoder" else {"tokens": tokens}
    )


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder"])
def test_causal_and_padding_never_changes_real_outputs(family, mixer):
    name = "tiny-gpt2" if family == "decoder_only" else "tiny-vaswani"
    cfg = preset(name, attention=mixer, num_layers=1, norm_position="pre", **EXTRA.get(mixer, {}))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(5, 32, (2, 8)), jnp.int32)
    inputs = jnp.asarray(rng.integers(5, 32, (2, 5)), jnp.int32)
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), _batch(family, tokens, inputs))
    apply = jax.jit(model.apply)
    logits = apply(params, _batch(family, tokens, inputs))
    changed = tokens.at[:, 5:].set(jnp.asarray(rng.integers(5, 32, (2, 3)), jnp.int32))
    new = apply(params, _batch(family, changed, inputs))
    np.testing.assert_allclose(new[:, :6], logits[:, :6], rtol=1e-5, atol=1e-5)
    assert not np.allclose(new[:, 6:], logits[:, 6:], atol=1e-3)
    padded = jnp.concatenate([tokens, jnp.zeros((2, 3), jnp.int32)], axis=1)
    np.testing.assert_allclose(
        apply(params, _batch(family, padded, inputs))[:, :8], logits, rtol=1e-5, atol=1e-5
    )
