"""The slow, obviously-correct twin of cached generation: greedy argmax rollout that runs the
full model over the whole sequence at every step (no KV cache), for tests and benchmarks.

The model family splits each prompt into a decoder prefix and a context
(``model.split_prompts``: decoder-only: the prompt and no context; encoder-decoder: an empty
prefix and the encoder inputs). Row ``i`` of the decoder buffer holds ``prefix_i, y_0 ..
y_{t-1}``, **right**-padded (the cached path left-pads), then a placeholder at column
``n_i + t`` whose logits predict ``y_t`` (causal attention: they never depend on it).
Segment ids are passed explicitly, so a generated id 0 is a token, not padding, exactly as in
the cached path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.decode.api import check_model, checked_prompts, eos_of
from tfmjax.decode.loop import GenerateOutput

_PLACEHOLDER = 1  # any non-pad id; causal masking hides it from the logits we read


@functools.partial(jax.jit, static_argnames=("model",))
def full_logits(model, params, tokens, segment_ids, context=None):
    """Uncached logits ``[B,T,V]`` of right-padded ``tokens``: ``logits[:, j]`` predicts
    ``tokens[:, j]`` (``context``: what ``model.split_prompts`` returned beside the prefix)."""
    return model.sequence_logits(params, tokens, segment_ids, context)


def generate_uncached(
    model, params, prompts, max_new_tokens: int, *, eos_id: int | str | None = "model", lengths=None
) -> GenerateOutput:
    """Greedy decoding without a cache; same arguments and output as :func:`generate`."""
    model = check_model(model)
    M = int(max_new_tokens)
    prefix, n, context = model.split_prompts(*checked_prompts(model, prompts, M, lengths))
    context = None if context is None else jax.tree.map(jnp.asarray, context)
    eos = eos_of(model, eos_id)
    B = prefix.shape[0]
    buf = np.zeros((B, int(n.max(initial=0)) + M), np.int32)
    buf[:, : prefix.shape[1]] = prefix
    out = np.zeros((B, M), np.int32)
    done = np.zeros((B,), bool)
    lengths = np.zeros((B,), np.int32)
    log_probs = np.zeros((B,), np.float32)
    rows = np.arange(B)
    for t in range(M):
        col = n + t
        buf[rows, col] = _PLACEHOLDER
        segment_ids = (np.arange(buf.shape[1])[None, :] <= col[:, None]).astype(np.int32)
        logits = full_logits(model, params, jnp.asarray(buf), jnp.asarray(segment_ids), context)
        step = np.asarray(logits)[rows, col]  # [B,V]
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
    return GenerateOutput(
        jnp.asarray(out), jnp.asarray(lengths), jnp.asarray(log_probs), jnp.asarray(log_probs)
    )
