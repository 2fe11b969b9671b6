"""The sampling loop (greedy, temperature, top-k, top-p) as one ``lax.while_loop``.

Step ``t`` picks token ``t`` of every row from the current logits, then feeds it to get the
next logits. A row stops at its first ``eos_id`` (which is kept; later tokens are 0); the loop
stops when every row has stopped or after ``max_new_tokens`` (``M``) tokens. The last token
is picked outside the loop, so no forward pass is wasted and the cache needs ``M - 1`` slots
after the prompt. Step ``t`` samples with ``fold_in(rng, t)``: the same seed gives the same
tokens, whatever the prompt padding.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class GenerateOutput(NamedTuple):
    """What :func:`tfmjax.decode.generate` returns (jax arrays)."""

    tokens: Any  # [B,M] int32 generated ids, EOS included, 0 after it
    lengths: Any  # [B]   int32 generated tokens per row, EOS included
    log_probs: Any  # [B]   float32 sum of the model's log p (temperature 1) of those tokens
    scores: Any  # [B]   float32 log_probs (sampling); the length-penalised score (beam)


class _State(NamedTuple):
    t: Any
    tokens: Any
    done: Any
    lengths: Any
    log_probs: Any
    logits: Any
    cache: Any


def _pick(state: _State, strategy, rng, eos_id):
    """Choose token ``t`` of every row from ``state.logits``; returns (state, token [B])."""
    token = strategy.sample(state.logits, jax.random.fold_in(rng, state.t))
    log_p = jnp.take_along_axis(jax.nn.log_softmax(state.logits, axis=-1), token[:, None], axis=-1)[
        :, 0
    ]
    live = ~state.done
    tokens = state.tokens.at[:, state.t].set(jnp.where(live, token, 0))
    state = state._replace(
        tokens=tokens,
        done=state.done | (live & (token == eos_id)),
        lengths=state.lengths + live.astype(jnp.int32),
        log_probs=state.log_probs + jnp.where(live, log_p, 0.0),
    )
    return state, token


def sample_loop(step_fn, logits, cache, strategy, max_new_tokens: int, eos_id, rng):
    """``step_fn(cache, tokens [B]) -> (logits [B,V], cache)``; ``logits`` come from prefill."""
    B = logits.shape[0]
    state = _State(
        t=jnp.zeros((), jnp.int32),
        tokens=jnp.zeros((B, max_new_tokens), jnp.int32),
        done=jnp.zeros((B,), bool),
        lengths=jnp.zeros((B,), jnp.int32),
        log_probs=jnp.zeros((B,), jnp.float32),
        logits=logits,
        cache=cache,
    )

    def cond(s):
        return (s.t < max_new_tokens - 1) & ~jnp.all(s.done)

    def body(s):
        s, token = _pick(s, strategy, rng, eos_id)
        logits, cache = step_fn(s.cache, token)
        return s._replace(t=s.t + 1, logits=logits, cache=cache)

    state = jax.lax.while_loop(cond, body, state)
    state, _ = _pick(state, strategy, rng, eos_id)
    return GenerateOutput(state.tokens, state.lengths, state.log_probs, state.log_probs)
