"""LSH attention (``model.attention = "lsh"``) in whole models: its fields are refused in one
line outside it and where they cannot work; a decoder_only model's cached decode (prefill,
then one token at a time) equals its full forward when the chunk covers the row, and is the
unchunked LSH attention otherwise; an encoder_decoder uses it on both sides."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import config as C
from tfmjax.models import build
from tfmjax.models.common import shift_right

TINY = dict(vocab_size=16, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_len=16)

REFUSED = [
    ({"lsh_buckets": 3}, "model.lsh_buckets=3 is invalid: must be 1 or even"),
    ({"lsh_rounds": 0}, "model.lsh_rounds=0 is invalid: must be > 0"),
    ({"lsh_chunk": 0}, "model.lsh_chunk=0 is invalid: must be > 0"),
    ({"position": "alibi"}, "model.position='alibi' is invalid: model.attention='lsh'"),
    ({"window": 4}, "model.window=4 is invalid: sparse patterns apply to softmax and mla"),
    ({"attention_impl": "xla"}, "model.attention_impl='xla' is invalid: picks a softmax"),
]


@pytest.mark.parametrize("fields,message", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_options_that_do_not_apply_are_refused_in_one_line(fields, message):
    with pytest.raises(C.ConfigError, match=message) as err:
        C.ModelConfig(**{"family": "decoder_only", "attention": "lsh", **fields})
    assert "\n" not in str(err.value)


def test_lsh_fields_apply_to_lsh_only():
    for field in ("lsh_buckets", "lsh_rounds", "lsh_chunk", "lsh_seed"):
        with pytest.raises(C.ConfigError, match=f"model.{field}=4 is invalid: applies to"):
            C.ModelConfig(family="decoder_only", **{field: 4})


def _cached_logits(model, params, tokens, prefix: int):
    """Prefill ``prefix`` shifted tokens, then feed the rest one at a time."""
    B, T = tokens.shape
    ids = shift_right(tokens, jnp.ones_like(tokens), model.config.bos_id)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    ones = jnp.ones_like(ids)
    layers = model.init_cache(B, T).layers
    fwd = jax.jit(lambda *a: model.apply(params, *a, method="forward"))
    out, layers = fwd(ids[:, :prefix], pos[:, :prefix], ones[:, :prefix], layers)
    outs = [out]
    for t in range(prefix, T):
        out, layers = fwd(ids[:, t : t + 1], pos[:, t : t + 1], ones[:, t : t + 1], layers)
        outs.append(out)
    return jnp.concatenate(outs, axis=1)


@pytest.mark.parametrize("chunk", [16, 3])
def test_cached_decode_is_the_unchunked_forward(chunk):
    """With the chunk covering the row, decoding reproduces the training forward; with a
    chunk of 3 it reproduces the same model run with the chunk covering the row (the
    unchunked form), not the chunked one."""
    cfg = C.ModelConfig(
        family="decoder_only", attention="lsh", lsh_buckets=4, lsh_chunk=chunk, **TINY
    )
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 16, (2, 11)), jnp.int32)
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), {"tokens": tokens})
    unchunked = build(C.ModelConfig(**{**cfg.__dict__, "lsh_chunk": 16}))
    want = jax.jit(unchunked.apply)(params, {"tokens": tokens})
    got = _cached_logits(model, params, tokens, prefix=4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if chunk < 11:
        chunked = jax.jit(model.apply)(params, {"tokens": tokens})
        assert float(jnp.abs(chunked - want).max()) > 1e-4


def test_padding_never_changes_real_outputs():
    """Padding hashes into a bucket of its own, sorted last: with chunks of 3 (several per
    row) right padding by any ids leaves the real tokens' logits alone."""
    cfg = C.ModelConfig(family="decoder_only", attention="lsh", lsh_buckets=4, lsh_chunk=3, **TINY)
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, 16, (2, 9)), jnp.int32)
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), {"tokens": tokens})
    apply = jax.jit(model.apply)
    plain = apply(params, {"tokens": tokens})
    segment_ids = jnp.concatenate([jnp.ones((2, 9), jnp.int32), jnp.zeros((2, 5), jnp.int32)], 1)
    for filler in (0, 7):
        padded = jnp.concatenate([tokens, jnp.full((2, 5), filler, jnp.int32)], axis=1)
        out = apply(params, {"tokens": padded, "segment_ids": segment_ids})
        np.testing.assert_allclose(out[:, :9], plain, rtol=1e-5, atol=1e-5)


def test_encoder_decoder_uses_it_on_both_sides():
    cfg = C.ModelConfig(family="encoder_decoder", attention="lsh", **TINY)
    batch = {"inputs": jnp.arange(3, 11)[None], "targets": jnp.arange(3, 8)[None]}
    params = jax.eval_shape(build(cfg).init, jax.random.key(0), batch)["params"]
    for side in ("encoder", "decoder"):
        assert set(params[side]["layers"]["attention"]) == {"query", "value", "out"}
