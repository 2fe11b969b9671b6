"""``generate``: check inputs on the host, then one jitted prefill + decode loop.

The jitted core takes the model, the strategy's kind (with ``TopK.k``, ``BeamSearch.beam_size``)
and ``max_new_tokens`` (``M``) as static arguments; ``eos_id``, the rng and the strategy's
floats (temperature, top-p, beam alpha: :func:`~tfmjax.decode.strategies.split_traced`) are
traced. Prompt widths come in buckets (the next power of two, capped by the context:
``model.prompt_arrays(..., bucket_for=M)``), so an interactive session or a temperature sweep
compiles one program per (batch size, width bucket). A decoder-only prompt too long for ``M``
new tokens is cropped to its last tokens (``crop``). The model family does the model-specific
parts (prompt layout, cache, prefill, one decode step: :mod:`tfmjax.models.family`); this
module and the loops never look at its kind.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.decode.beam import beam_search
from tfmjax.decode.loop import GenerateOutput, sample_loop
from tfmjax.decode.strategies import (
    STRATEGIES,
    BeamSearch,
    Greedy,
    TopK,
    bind_traced,
    split_traced,
)
from tfmjax.models.prompts import read_prompts
from tfmjax.parallel.processes import to_host


def check_model(model):
    """The model as generation needs it: a family that generates, dropout off."""
    if getattr(getattr(model, "config", None), "input", "tokens") == "patches":
        raise ValueError(
            "cannot generate with a patch (image) model (model.input='patches'): it has no "
            "generation, it reads an image and names its class (tfmjax.evaluation scores it)"
        )
    if not getattr(model, "can_generate", False):
        family = getattr(model, "family", type(model).__name__)
        raise ValueError(
            f"cannot generate with model family {family!r}: build a decoder_only "
            "or encoder_decoder model with tfmjax.models.build"
        )
    return model if model.deterministic else model.clone(deterministic=True)


def check_strategy(strategy, vocab_size: int) -> None:
    if not isinstance(strategy, STRATEGIES):
        raise ValueError(
            f"strategy={strategy!r} is not one of {', '.join(s.__name__ for s in STRATEGIES)}"
        )
    if isinstance(strategy, TopK) and strategy.k > vocab_size:
        raise ValueError(f"TopK(k={strategy.k}) exceeds the vocabulary size {vocab_size}")


def check_max_new_tokens(max_new_tokens) -> None:
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, (int, np.integer))
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: must be an int >= 1")


def checked_prompts(model, prompts, max_new_tokens: int, lengths=None, crop: bool = True):
    """Check a generation request on the host: ``prompts`` (and ``lengths``) -> right-padded
    int32 ``[B,P]`` and its row lengths ``[B]`` (:func:`tfmjax.models.prompts.read_prompts`
    with the model's pad id). ``crop``: prompts too long for ``max_new_tokens`` keep their
    last tokens that fit, where the family can (decoder-only; ``model.crop_prompts``), with
    one line on stderr; otherwise ``model.check_generation`` refuses them."""
    check_max_new_tokens(max_new_tokens)
    cfg = model.config
    arr, lengths = read_prompts(
        prompts, cfg.vocab_size, model.prompt_name, pad_id=cfg.pad_id, lengths=lengths
    )
    if crop:
        arr, lengths, dropped = model.crop_prompts(arr, lengths, int(max_new_tokens))
        if dropped.any():
            print(
                f"warning: dropped the first {int(dropped.max())} token(s) of the longest "
                f"prompt ({int(dropped.sum())} in {int((dropped > 0).sum())} prompt(s)) to "
                f"leave room for max_new_tokens={int(max_new_tokens)} in "
                f"model.max_len={cfg.max_len} (crop=False refuses instead)",
                file=sys.stderr,
            )
    model.check_generation(lengths, int(max_new_tokens))
    return arr, lengths


def eos_of(model, eos_id) -> int:
    """The EOS id a row stops after: ``model.eos_id`` for ``"model"``; -1 (never) for None."""
    if isinstance(eos_id, str) and eos_id == "model":
        eos_id = model.config.eos_id
    if eos_id is not None and (
        isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer))
    ):
        raise ValueError(f"eos_id={eos_id!r} is invalid: must be a token id (int), None or 'model'")
    return -1 if eos_id is None else int(eos_id)


def _as_key(rng, strategy):
    if rng is None:
        if not isinstance(strategy, (Greedy, BeamSearch)):
            raise ValueError(
                f"{type(strategy).__name__} samples: pass rng=jax.random.key(seed) (or an int seed)"
            )
        return jax.random.key(0)
    if isinstance(rng, int) and not isinstance(rng, bool):
        return jax.random.key(rng)
    return rng


def generate(
    model,
    params,
    prompts,
    strategy,
    max_new_tokens: int,
    *,
    rng=None,
    eos_id: int | str | None = "model",
    lengths=None,
    crop: bool = True,
    bucket: bool = True,
) -> GenerateOutput:
    """Generate ``max_new_tokens`` (``M``) tokens per prompt with a KV cache.

    ``model``: a module from :func:`tfmjax.models.build` whose family generates
    (decoder-only, encoder-decoder).
    ``prompts``: a list of id lists, or a ``[B,P]`` int array right-padded with the model's
    ``model.pad_id`` (or of the row ``lengths`` given; a model without a pad id reads every
    row whole). Any other id is a token, 0 included. Decoder-only: the prompt ids (e.g.
    ``source SEP``; BOS is put in front here if ``model.prompt_bos``, and rows are
    left-padded internally, see :mod:`tfmjax.models.prompts`). Encoder-decoder: the encoder
    inputs (e.g. ``source EOS``).
    ``strategy``: Greedy(), Temperature(τ), TopK(k, τ), TopP(p, τ) or BeamSearch(W, alpha).
    ``rng``: a key (or int seed) for the sampling strategies. ``eos_id``: a row stops after
    emitting it (``"model"``: ``model.eos_id``; None: never stop early).
    ``crop``: a decoder-only prompt longer than ``model.max_len - M`` keeps its last
    ``max_len - M`` tokens, and one line on stderr says how many were dropped (False: refused,
    as encoder inputs always are). ``bucket``: prompts are padded to a width bucket (the next
    power of two, capped by the context) so new prompt lengths reuse a compiled program; the
    tokens are the same (False: compile for the exact width).

    Returns :class:`GenerateOutput` ``(tokens [B,M], lengths [B], log_probs [B], scores [B])``:
    ``tokens`` hold 0 after a row's EOS (0 may be a token too: ``lengths`` says where a row ends).
    """
    model = check_model(model)
    check_strategy(strategy, model.config.vocab_size)
    arr, lengths = checked_prompts(model, prompts, max_new_tokens, lengths, crop)
    eos = eos_of(model, eos_id)
    key = _as_key(rng, strategy)
    M = int(max_new_tokens)
    static, values = split_traced(strategy)
    run = functools.partial(
        _generate_jit, traced=values, model=model, strategy=static, max_new_tokens=M
    )
    if model.equal_length_prompts and len(set(lengths.tolist())) > 1:
        return _by_length(model, params, arr, lengths, key, jnp.int32(eos), run)
    arrays = model.prompt_arrays(arr, lengths, bucket_for=M if bucket else None)
    return run(params, tuple(jnp.asarray(a) for a in arrays), key, jnp.int32(eos))


def _by_length(model, params, arr, lengths, key, eos, run) -> GenerateOutput:
    """Generate each group of equal-length prompts apart (group ``i`` samples with
    ``fold_in(key, i)``) and put the rows back in order: for a family whose prompts must
    not be padded (``model.equal_length_prompts``, e.g. global tokens counted from slot 0)."""
    parts = []
    for i, n in enumerate(sorted(set(lengths.tolist()))):
        rows = np.flatnonzero(lengths == n)
        arrays = tuple(jnp.asarray(a) for a in model.prompt_arrays(arr[rows, :n], lengths[rows]))
        parts.append((rows, to_host(run(params, arrays, jax.random.fold_in(key, i), eos))))
    out = []
    for field in GenerateOutput._fields:
        first = getattr(parts[0][1], field)
        merged = np.zeros((len(arr), *first.shape[1:]), first.dtype)
        for rows, part in parts:
            merged[rows] = getattr(part, field)
        out.append(jnp.asarray(merged))
    return GenerateOutput(*out)


@functools.partial(jax.jit, static_argnames=("model", "strategy", "max_new_tokens"))
def _generate_jit(params, arrays, rng, eos_id, *, traced, model, strategy, max_new_tokens):
    """``strategy``: the static part of :func:`split_traced`, ``traced`` its float fields."""
    strategy = bind_traced(strategy, traced)
    model, params = model.unrolled(params)  # once, outside the loop
    logits, cache = model.prefill(params, arrays, max_new_tokens)
    step_fn = functools.partial(model.decode_step, params)
    if isinstance(strategy, BeamSearch):
        return beam_search(step_fn, logits, cache, strategy, max_new_tokens, eos_id)
    return sample_loop(step_fn, logits, cache, strategy, max_new_tokens, eos_id, rng)
