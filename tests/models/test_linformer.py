"""Linformer attention (``model.attention = "linformer"``) in whole models: bidirectional only,
so a decoder_only model refuses it and an encoder_decoder's decoder keeps softmax; its fields
are refused in one line outside it; padding never changes real outputs; the preset's
gradients are finite. Tiny shapes: the whole file is a few seconds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import config as C
from tfmjax.models import build, preset

TINY = dict(vocab_size=32, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=16)

REFUSED = [
    ({"family": "decoder_only"}, "model.attention='linformer' is invalid: .*bidirectional only"),
    ({"position": "alibi"}, "model.position='alibi' is invalid: model.attention='linformer'"),
    ({"window": 4}, "model.window=4 is invalid: sparse patterns apply to softmax and mla"),
    ({"attention_impl": "xla"}, "model.attention_impl='xla' is invalid: picks a softmax"),
    ({"linformer_rank": 0}, "model.linformer_rank=0 is invalid: must be in 1..model.max_len"),
    ({"linformer_rank": 17}, "model.linformer_rank=17 is invalid: must be in 1..model.max_len=16"),
    ({"num_landmarks": 4}, "model.num_landmarks=4 is invalid: applies to model.attention='nys"),
]


@pytest.mark.parametrize("fields,message", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_options_that_do_not_apply_are_refused_in_one_line(fields, message):
    base = dict(family="encoder_only", attention="linformer", max_len=16)
    with pytest.raises(C.ConfigError, match=message) as err:
        C.ModelConfig(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_linformer_fields_apply_to_linformer_only():
    for field, value in (("linformer_rank", 4), ("linformer_share_kv", True)):
        with pytest.raises(C.ConfigError, match=f"model.{field}={value!r} is invalid: applies"):
            C.ModelConfig(family="encoder_only", **{field: value})


def test_encoder_decoder_uses_it_in_the_encoder_only():
    """The encoder's attention has the sequence projections; the decoder's self-attention
    stays softmax (query, key, value, out) with a KV cache."""
    cfg = preset("tiny-vaswani", attention="linformer", linformer_rank=4, **TINY)
    batch = {"inputs": jnp.arange(3, 11)[None], "targets": jnp.arange(3, 8)[None]}
    model = build(cfg)
    params = jax.eval_shape(model.init, jax.random.key(0), batch)["params"]
    assert set(params["encoder"]["layers"]["attention"]) == {
        *("query", "key", "value", "out", "proj_e", "proj_f")
    }
    assert set(params["decoder"]["layers"]["attention"]) == {"query", "key", "value", "out"}
    assert model.kv_cache_bytes(1, 4) > 0


def test_padding_never_changes_real_outputs_and_gradients_are_finite():
    """An encoder_only model (the preset, shrunk; E = F): a row padded on the right with any
    ids gives its real tokens the logits of the unpadded row (padding is zeroed before the
    projection, and a real token keeps its column); then one masked-LM gradient is finite."""
    cfg = preset("tiny-linformer", **dict(TINY, linformer_rank=4, linformer_share_kv=True))
    tokens = jnp.asarray(np.random.default_rng(0).integers(5, 32, (2, 7)), jnp.int32)
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), {"tokens": tokens})
    assert "proj_f" not in params["params"]["encoder"]["layers"]["attention"]
    apply = jax.jit(model.apply)
    plain = apply(params, {"tokens": tokens})
    segment_ids = jnp.concatenate([jnp.ones((2, 7), jnp.int32), jnp.zeros((2, 4), jnp.int32)], 1)
    for filler in (0, 9):
        padded = jnp.concatenate([tokens, jnp.full((2, 4), filler, jnp.int32)], axis=1)
        out = apply(params, {"tokens": padded, "segment_ids": segment_ids})
        np.testing.assert_allclose(out[:, :7], plain, rtol=1e-5, atol=1e-5)

    def loss(params):
        logits = model.apply(params, {"tokens": tokens})
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

    grads = jax.jit(jax.grad(loss))(params)
    leaves = jax.tree.leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    proj = grads["params"]["encoder"]["layers"]["attention"]["proj_e"]
    assert float(jnp.abs(proj[..., :7]).max()) > 0 and float(jnp.abs(proj[..., 7:]).max()) == 0
