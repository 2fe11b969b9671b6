"""Head scores on repeated random sequences (Olsson et al. 2022, "In-context Learning and
Induction Heads").

The input is ``r_1 .. r_n r_1 .. r_n`` (random content ids). In the second copy, a query at
a token whose first occurrence is ``d`` positions back scores

- previous-token:  its attention to the position just before it,
- duplicate-token: its attention to the same token's first occurrence (``d`` back),
- induction:       its attention to the token after that first occurrence (``d − 1`` back),

averaged over the second copy's queries and the batch: ``[L,N]`` per score.

They read ``attn.hook_pattern``, which softmax attention forms; a stack whose self-attention
forms none (retention: decayed scores, not a softmax; selective_scan: no attention;
nystrom: three landmark kernels, their product never formed) is refused in one line, and so
is one whose pattern is not over tokens (linformer: each query over ``R`` projected keys,
mixes of positions; its variant says ``token_pattern = False``). An encoder_decoder model's
other stack keeps softmax, and is scored as usual.
"""

from __future__ import annotations

import fnmatch

import jax
import jax.numpy as jnp

from tfmjax.data.vocab import RESERVED_TOKENS
from tfmjax.interp.circuits import stack_attention
from tfmjax.interp.hooked import hook_shapes, run_with_cache
from tfmjax.layers.attention_variants import ATTENTION_VARIANTS

SCORES = ("previous_token", "duplicate_token", "induction")


def repeated_batch(model, key, batch: int, length: int, high: int | None = None) -> dict:
    """A family batch whose token rows are ``r ++ r``, ``r`` of ``length`` random content ids
    below ``high`` (default the model's vocab; pass the task's vocab size to stay inside what
    it trained on). Both sides of an encoder-decoder get the same rows."""
    low = len(RESERVED_TOKENS)
    r = jax.random.randint(key, (batch, length), low, high or model.config.vocab_size)
    rows = jnp.concatenate([r, r], axis=1).astype(jnp.int32)
    return {name: rows for name in model.token_keys}


def scores_from_patterns(patterns, length: int, shift: int):
    """``patterns [L,B,N,T,T]`` of a repeated sequence -> ``{score: [L,N]}``.

    ``shift``: how far the stack's inputs are shifted right (1 for a decoder, which reads
    BOS first; 0 for an encoder), so query ``t`` holds token ``t - shift`` of ``r ++ r``.
    """
    T = patterns.shape[-1]
    queries = jnp.arange(length + shift, T)  # the second copy's tokens
    back = {"previous_token": 1, "duplicate_token": length, "induction": length - 1}
    out = {}
    for name, distance in back.items():
        picked = patterns[..., queries, queries - distance]  # [L,B,N,Q]
        out[name] = jnp.mean(picked, axis=(1, 3))
    return out


def _token_pattern(model, stack: str) -> bool:
    """Whether a pattern of ``stack``'s self-attention, if it forms one, is over tokens."""
    return getattr(ATTENTION_VARIANTS[stack_attention(model, stack)], "token_pattern", True)


def pattern_stacks(model, params) -> list[str]:
    """The stacks whose self-attention forms patterns over tokens, which head scores read."""
    shapes = hook_shapes(model, params, model.dummy_batch())
    wanted = lambda stack: f"{stack}.blocks.*.attn.hook_pattern"  # noqa: E731
    return [
        stack
        for stack in model.layer_stacks()
        if _token_pattern(model, stack)
        and any(fnmatch.fnmatchcase(n, wanted(stack)) for n in shapes)
    ]


def head_scores(
    model, params, key, *, batch: int = 16, length: int = 10, stack="decoder", high=None
):
    """``{score: [L,N]}`` of the self-attention heads of ``stack`` (see module docstring)."""
    if stack not in model.layer_stacks():
        raise ValueError(f"stack={stack!r} is not one of {', '.join(model.layer_stacks())}")
    if 2 * length > model.config.max_len:
        raise ValueError(
            f"a repeated sequence of 2 x {length} tokens does not fit model.max_len="
            f"{model.config.max_len}; pass a smaller length"
        )
    data = repeated_batch(model, key, batch, length, high)
    names = f"{stack}.blocks.*.attn.hook_pattern"
    if not _token_pattern(model, stack):
        raise ValueError(
            f"head scores read attention patterns over tokens ({names}); the {stack}'s "
            f"self-attention, model.attention={stack_attention(model, stack)!r}, attends to "
            "projected keys (mixes of positions), not tokens"
        )
    if not any(fnmatch.fnmatchcase(n, names) for n in hook_shapes(model, params, data)):
        raise ValueError(
            f"head scores read attention patterns ({names}); the {stack}'s self-attention, "
            f"model.attention={stack_attention(model, stack)!r}, forms none (softmax does)"
        )
    _, cache = run_with_cache(model, params, data, names=[names])
    patterns = cache.stack("attn.hook_pattern", stack)  # [L,B,N,T,T]
    return scores_from_patterns(patterns, length, shift=int(stack == "decoder"))
