"""The slow, obviously-correct twin of cached generation: greedy argmax rollout that runs the
full model over the whole sequence at every step (no KV cache), for tests and benchmarks.

Decoder-only rows are **right**-padded here (the cached path left-pads): row ``i`` holds
``prompt_i, y_0 .. y_{t-1}`` then a placeholder at column ``n_i + t`` (causal attention: the
logits there never depend on it), whose logits predict ``y_t``. Segment ids are passed
explicitly so a generated id 0 is a token, not padding, exactly as in the cached path.
Encoder-decoder: the encoder and the full decoder run every step (the model's ``__call__``
with explicit decoder segment ids).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.data.vocab import EOS_ID
from tfmjax.decode import prompts as P
from tfmjax.decode.api import check_model
from tfmjax.decode.loop import GenerateOutput

_PLACEHOLDER = 1   # any non-pad id; causal masking hides it from the logits we read


@functools.partial(jax.jit, static_argnames=("model",))
def full_logits(model, params, tokens, segment_ids, inputs=None):
    """Uncached logits ``[B,T,V]``: ``logits[:, j]`` predicts ``tokens[:, j]``.

    Decoder-only: ``model.apply(params, {"tokens", "segment_ids", "positions"})``.
    Encoder-decoder (``inputs [B,S]`` given): encoder + decoder over ``BOS, tokens[:, :-1]``.
    """
    positions = jnp.cumsum(segment_ids, axis=1) - 1
    positions = jnp.where(segment_ids > 0, positions, 0).astype(jnp.int32)
    if inputs is None:
        return model.apply(params, {"tokens": tokens, "segment_ids": segment_ids,
                                    "positions": positions})
    bos = model.config.bos_id
    shifted = jnp.concatenate([jnp.full_like(tokens[:, :1], bos), tokens[:, :-1]], axis=1)
    encoded = model.apply(params, inputs, method="encode")
    logits, _ = model.apply(params, shifted, positions, segment_ids, encoded,
                            (inputs != 0).astype(jnp.int32), method="decode")
    return logits


def generate_uncached(model, params, prompts, max_new_tokens: int, *,
                      eos_id: int | None = EOS_ID) -> GenerateOutput:
    """Greedy decoding without a cache; same arguments and output as :func:`generate`."""
    model = check_model(model)
    config = model.config
    P.check_max_new_tokens(max_new_tokens)
    arr = P.as_right_padded(prompts, config.vocab_size)
    eos = -1 if eos_id is None else int(eos_id)
    N = int(max_new_tokens)
    decoder_only = config.family == "decoder_only"
    if decoder_only:
        n = P.prompt_lengths(arr)
        P.check_lengths(config, n, N)
        buf = np.zeros((arr.shape[0], int(n.max()) + N), np.int32)
        buf[:, :arr.shape[1]] = arr
        inputs = None
    else:
        P.check_lengths(config, P.prompt_lengths(arr), N)
        n = np.zeros((arr.shape[0],), np.int32)
        buf = np.zeros((arr.shape[0], N), np.int32)
        inputs = jnp.asarray(arr)
    B = buf.shape[0]
    out = np.zeros((B, N), np.int32)
    done = np.zeros((B,), bool)
    lengths = np.zeros((B,), np.int32)
    log_probs = np.zeros((B,), np.float32)
    rows = np.arange(B)
    for t in range(N):
        col = n + t
        buf[rows, col] = _PLACEHOLDER
        segment_ids = (np.arange(buf.shape[1])[None, :] <= col[:, None]).astype(np.int32)
        logits = full_logits(model, params, jnp.asarray(buf), jnp.asarray(segment_ids), inputs)
        step = np.asarray(logits)[rows, col]                                       # [B,V]
        token = step.argmax(-1).astype(np.int32)
        log_p = np.asarray(jax.nn.log_softmax(jnp.asarray(step), axis=-1))[rows, token]
        live = ~done
        out[:, t] = np.where(live, token, 0)
        lengths += live
        log_probs += np.where(live, log_p, 0.0).astype(np.float32)
        done |= live & (token == eos)
        buf[rows, col] = token
        if done.all():
            break
    return GenerateOutput(jnp.asarray(out), jnp.asarray(lengths), jnp.asarray(log_probs),
                          jnp.asarray(log_probs))
