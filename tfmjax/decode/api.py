"""``generate``: check inputs on the host, then one jitted prefill + decode loop.

The jitted core takes the model, strategy and ``max_new_tokens`` as static arguments, so it
compiles once per (those, prompt shape) and is reused after; ``eos_id`` and the rng are traced.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.data.vocab import EOS_ID
from tfmjax.decode import prompts as P
from tfmjax.decode.beam import beam_search
from tfmjax.decode.loop import GenerateOutput, sample_loop
from tfmjax.decode.steps import (decode_step, prefill_decoder_only, prefill_encoder_decoder,
                                 unrolled)
from tfmjax.decode.strategies import STRATEGIES, BeamSearch, Greedy, TopK


def check_model(model):
    """The model as generation needs it: a decoder family, dropout off."""
    config = getattr(model, "config", None)
    if config is None or config.family not in ("decoder_only", "encoder_decoder"):
        family = getattr(config, "family", type(model).__name__)
        raise ValueError(f"cannot generate with model family {family!r}: build a decoder_only "
                         "or encoder_decoder model with tfmjax.models.build")
    return model if model.deterministic else model.clone(deterministic=True)


def check_strategy(strategy, vocab_size: int) -> None:
    if not isinstance(strategy, STRATEGIES):
        raise ValueError(f"strategy={strategy!r} is not one of "
                         f"{', '.join(s.__name__ for s in STRATEGIES)}")
    if isinstance(strategy, TopK) and strategy.k > vocab_size:
        raise ValueError(f"TopK(k={strategy.k}) exceeds the vocabulary size {vocab_size}")


def _as_key(rng, strategy):
    if rng is None:
        if not isinstance(strategy, (Greedy, BeamSearch)):
            raise ValueError(f"{type(strategy).__name__} samples: pass rng=jax.random.key(seed) "
                             "(or an int seed)")
        return jax.random.key(0)
    if isinstance(rng, int) and not isinstance(rng, bool):
        return jax.random.key(rng)
    return rng


def generate(model, params, prompts, strategy, max_new_tokens: int, *, rng=None,
             eos_id: int | None = EOS_ID) -> GenerateOutput:
    """Generate ``max_new_tokens`` tokens per prompt with a KV cache.

    ``model``: a decoder_only or encoder_decoder module from :func:`tfmjax.models.build`.
    ``prompts``: decoder-only: the prompt ids (e.g. ``source SEP``) as a ``[B,P]`` int array
    right-padded with 0, or a list of id lists (BOS is added here; rows are left-padded
    internally, see :mod:`tfmjax.decode.prompts`). Encoder-decoder: the encoder inputs
    ``[B,S]`` (e.g. ``source EOS``), 0-padded.
    ``strategy``: Greedy(), Temperature(τ), TopK(k, τ), TopP(p, τ) or BeamSearch(W, alpha).
    ``rng``: a key (or int seed) for the sampling strategies. ``eos_id``: a row stops after
    emitting it (None: never stop early).

    Returns :class:`GenerateOutput` ``(tokens [B,N], lengths [B], log_probs [B], scores [B])``:
    ``tokens`` hold 0 after a row's EOS.
    """
    model = check_model(model)
    config = model.config
    check_strategy(strategy, config.vocab_size)
    P.check_max_new_tokens(max_new_tokens)
    if eos_id is not None and (isinstance(eos_id, bool)
                               or not isinstance(eos_id, (int, np.integer))):
        raise ValueError(f"eos_id={eos_id!r} is invalid: must be a token id (int) or None")
    eos = -1 if eos_id is None else int(eos_id)
    key = _as_key(rng, strategy)
    what = "prompts" if config.family == "decoder_only" else "encoder inputs"
    arr = P.as_right_padded(prompts, config.vocab_size, what)
    P.check_lengths(config, P.prompt_lengths(arr), int(max_new_tokens))
    if config.family == "decoder_only":
        prompt = P.left_pad_decoder_prompts(arr, config.bos_id)
        arrays = tuple(jnp.asarray(a) for a in prompt[:3])
    else:
        arrays = (jnp.asarray(arr),)
    return _generate_jit(params, arrays, key, jnp.int32(eos), model=model, strategy=strategy,
                         max_new_tokens=int(max_new_tokens))


@functools.partial(jax.jit, static_argnames=("model", "strategy", "max_new_tokens"))
def _generate_jit(params, arrays, rng, eos_id, *, model, strategy, max_new_tokens):
    model, params = unrolled(model, params)       # once, outside the loop
    if model.config.family == "decoder_only":
        ids = arrays[0]
        logits, cache = prefill_decoder_only(model, params, *arrays,
                                             capacity=ids.shape[1] + max_new_tokens - 1)
    else:
        logits, cache = prefill_encoder_decoder(model, params, arrays[0],
                                                capacity=max_new_tokens)
    step_fn = functools.partial(decode_step, model, params)
    if isinstance(strategy, BeamSearch):
        return beam_search(step_fn, logits, cache, strategy, max_new_tokens, eos_id)
    return sample_loop(step_fn, logits, cache, strategy, max_new_tokens, eos_id, rng)
