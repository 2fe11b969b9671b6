"""Prefill and single-token decode steps over a :class:`~tfmjax.decode.cache.KVCache`.

These are pure functions of arrays (jit them, or call them from the jitted loop):

* :func:`prefill_decoder_only`: the whole left-padded prompt (BOS included) in one pass;
* :func:`prefill_encoder_decoder`: encode once, project cross K/V once (inside the model's
  first decoder call), and run BOS;
* :func:`decode_step`: feed one token per row, at position ``cache.lengths``.

Each returns ``(logits [B,V] of the next token, cache)``. They run the model with unrolled
layers (:func:`unrolled`): the per-layer cache tuple is then updated in place, and no layer's
weights are sliced out of a stacked array at every step.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from tfmjax.decode.cache import KVCache, init_cache
from tfmjax.layers.stack import unstack_params


def unrolled(model, params):
    """``(model, params)`` with ``scan_layers=False``: the same function, layers unrolled.

    Scanned stacks ``{"layers": [L, ...]}`` become ``{"layer_0": ..., ...}``; a model that is
    already unrolled is returned as it is.
    """
    cfg = model.config
    if not cfg.scan_layers:
        return model, params
    layers = {"encoder": cfg.num_layers,
              "decoder": cfg.num_layers if cfg.family == "decoder_only" else cfg.decoder_layers}
    inner = {name: unstack_params(sub, layers[name]) if name in layers and "layers" in sub
             else sub for name, sub in params["params"].items()}
    model = type(model)(dataclasses.replace(cfg, scan_layers=False), deterministic=True)
    return model, dict(params, params=inner)


def prefill_decoder_only(model, params, ids, positions, segment_ids, capacity: int):
    """``ids/positions/segment_ids [B,W]`` (a left-padded :class:`DecoderPrompt`)."""
    model, params = unrolled(model, params)
    B, W = ids.shape
    cache = init_cache(model.config, B, capacity)
    logits, layers = model.apply(params, ids, positions, segment_ids, cache.layers,
                                 method="forward")
    lengths = jnp.max(positions, axis=1).astype(jnp.int32) + 1
    return logits[:, -1], KVCache(layers=layers, lengths=lengths)


def prefill_encoder_decoder(model, params, inputs, capacity: int):
    """``inputs [B,S]`` encoder ids, right-padded with 0."""
    model, params = unrolled(model, params)
    B = inputs.shape[0]
    encoded_segment_ids = (inputs != 0).astype(jnp.int32)
    encoded = model.apply(params, inputs, method="encode")
    cache = init_cache(model.config, B, capacity)
    bos = jnp.full((B, 1), model.config.bos_id, jnp.int32)
    logits, layers = model.apply(params, bos, jnp.zeros((B, 1), jnp.int32),
                                 jnp.ones((B, 1), jnp.int32), encoded, encoded_segment_ids,
                                 cache.layers, method="decode")
    cache = KVCache(layers=layers, lengths=jnp.ones((B,), jnp.int32), encoded=encoded,
                    encoded_segment_ids=encoded_segment_ids)
    return logits[:, -1], cache


def decode_step(model, params, cache: KVCache, tokens):
    """Feed ``tokens [B]`` (one per row) and return the next logits ``[B,V]`` and the cache."""
    model, params = unrolled(model, params)
    ids = tokens.astype(jnp.int32)[:, None]
    positions = cache.lengths[:, None]
    segment_ids = jnp.ones_like(ids)
    if cache.encoded is None:
        logits, layers = model.apply(params, ids, positions, segment_ids, cache.layers,
                                     method="forward")
    else:
        logits, layers = model.apply(params, ids, positions, segment_ids, cache.encoded,
                                     cache.encoded_segment_ids, cache.layers, method="decode")
    return logits[:, 0], dataclasses.replace(cache, layers=layers, lengths=cache.lengths + 1)
