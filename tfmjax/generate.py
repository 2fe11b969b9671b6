"""Generate from a trained checkpoint: ``python -m tfmjax.generate WORKDIR --input "c a b"``.

The checkpoint under WORKDIR (written by the training loop) holds the experiment config and
the params; its tokenizer (:class:`~tfmjax.data.tokenizers.Tokenizer`: a toy task's
vocabulary, a corpus's tokenizer or an imported model's own) turns text into ids and back,
on one path for all three (:func:`generate_texts`). ``--input`` may be repeated
(one batch). ``--decode greedy|beam|sample`` with ``--beam-size``, ``--temperature``,
``--top-k``, ``--top-p`` (:mod:`tfmjax.decode.options`); default greedy.

An imported Hugging Face model (``python -m tfmjax.hf import``) encodes ``--input`` with
its own tokenizer, saved in its checkpoint at import, continues it up to its EOS (or
``--max-new-tokens``, default 16) and prints text; ``--ids`` gives it token ids instead.

A language model of a text task (``data.task = "shakespeare"``) continues plain text with
the tokenizer saved in its checkpoint, e.g. ``--input "ROMEO:"``; its default decoding is
the task's sampling (top-k and temperature of ``data.task_params``), and it prints as many
new tokens as the task's ``sample_tokens`` (or ``--max-new-tokens``), sliding the context
window on once ``model.max_len`` is full.

An input longer than the model's context keeps its last tokens (those that leave room for
the new ones; a text task's: the window's last half), and one line on stderr says how many
were dropped; ``--no-crop`` refuses it instead. Encoder inputs are never cropped.

Mesh: the params are restored directly onto a device mesh, each device reading only its
own shards, and decoded there; by default the checkpoint's own mesh fitted to the devices
present (one line on stderr names the mesh whenever it is not the checkpoint's own).
``mesh.data``, ``mesh.fsdp``, ``mesh.tensor`` and ``mesh.rules`` overrides, as ``train.py``
takes them, apply on top of the checkpoint's ``[mesh]`` and are used as given (not fitted),
e.g. ``python -m tfmjax.generate WORKDIR mesh.data=1 mesh.fsdp=-1 mesh.tensor=1 --input "c a b"``.
Many processes: ``--coordinator``, ``--num-processes``, ``--process-id`` as for ``train.py``;
every process decodes its part, process 0 alone prints.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tfmjax.config import ModelConfig
from tfmjax.data.vocab import RESERVED_TOKENS

if TYPE_CHECKING:
    from tfmjax.data.tokenizers import Tokenizer

# JAX and the model code are imported inside the functions that use them, so the Ctrl-C
# handler that ``main`` installs first also covers their (seconds-long) import.


def prompt_ids(model, tokenizer: Tokenizer, text: str, task=None) -> list[int]:
    """The ids the model continues: ``text`` as ``tokenizer`` encodes it; a toy ``task``'s
    input in the layout its family was trained to answer (``model.prompt_for_source``, e.g.
    ``source SEP``). ValueError (one line): an empty input, a special token in a task input."""
    if task is not None and tokenizer.size > model.config.vocab_size:
        raise ValueError(
            f"the task vocabulary has {tokenizer.size} ids but model.vocab_size="
            f"{model.config.vocab_size}"
        )
    ids = tokenizer.encode(text)
    if not ids:
        give = 'task symbols, e.g. "c a b"' if task else 'the text to continue, e.g. "Hello"'
        raise ValueError(f"--input is empty: give {give}")
    if task is None:
        return ids
    special = [RESERVED_TOKENS[i] for i in ids if i < len(RESERVED_TOKENS)]
    if special:
        raise ValueError(
            f"--input {text!r} holds the special token {special[0]}: inputs are "
            "task symbols only (the end markers are added for you)"
        )
    return model.prompt_for_source(ids)


def check_trained_length(task, texts: list[str]) -> list[str]:
    """Warnings (one line each) for inputs longer than any the model was trained on."""
    longest = task.max_source_len("train")
    return [
        f"warning: --input {t!r} has {len(t.split())} symbols but the model was trained on "
        f"at most {longest} (task {task.name}); its answer is unlikely to be right"
        for t in texts
        if len(t.split()) > longest
    ]


def generate_texts(
    model_config: ModelConfig,
    params,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    strategy=None,
    max_new_tokens: int | None = None,
    seed: int = 0,
    *,
    task=None,
    text=None,
    crop: bool = True,
) -> list[str]:
    """What the model writes after each of ``texts``, for every source: one path from text
    to ids (:func:`prompt_ids`) to new ids (:func:`new_ids`) to text (``tokenizer.decode``,
    the model's EOS left out). ``task``: a toy task answering its inputs (the caller applies
    ``task.canonical_input``), greedy, by default its longest answer + EOS. ``text``: a text
    task's ``TextParams``: its top-k sampling and ``sample_tokens`` by default, each text
    continued on its own. Neither: an imported model's text, greedy, 16 tokens by default.
    ``crop``: a prompt too long for the model keeps its last tokens, with one line on stderr
    (False: refused); see :func:`new_ids`."""
    from tfmjax.decode import Greedy, TopK
    from tfmjax.models import build

    model = build(model_config)
    prompts = [prompt_ids(model, tokenizer, t, task) for t in texts]
    if text is not None:
        strategy = strategy or TopK(min(text.top_k, model_config.vocab_size) or 1, text.temperature)
        max_new_tokens = max_new_tokens or text.sample_tokens
    elif task is not None:
        max_new_tokens = max_new_tokens or task.max_target_len("eval") + 1
    rows = new_ids(
        model, params, prompts, strategy or Greedy(), max_new_tokens or 16, seed,
        slide=task is None, apart=text is not None, crop=crop,
    )  # fmt: skip
    eos = model_config.eos_id
    return [tokenizer.decode(row[: row.index(eos)] if eos in row else row) for row in rows]


def new_ids(
    model, params, prompts, strategy, max_new_tokens: int, seed: int, *, slide, apart, crop=True
):
    """The new ids of each prompt (up to and including the model's EOS): one batch sampled
    with ``seed``; or each prompt on its own with ``fold_in(key(seed), i)``, ``apart`` or
    (``slide``) when a prompt and its new ids pass ``model.max_len``: :func:`continue_text`.
    ``crop``: a prompt that fills the context keeps its last tokens, as the sliding window
    does (``slide``), or as many as leave room for ``max_new_tokens`` (the batch, by
    :func:`~tfmjax.decode.generate`), one line on stderr saying how many were dropped;
    False: refused (ValueError, one line)."""
    import jax

    from tfmjax.decode import generate

    longest, max_len = max(len(p) for p in prompts), model.config.max_len
    if slide and not crop:
        _check_prompt_fits(longest, max_len)
    elif slide and longest >= max_len:
        keep = max(max_len // 2, 1)  # what continue_text's window keeps
        print(
            f"warning: dropped the first {longest - keep} of the longest input's {longest} "
            f"tokens: it fills the model's model.max_len={max_len} positions, and the "
            f"window keeps the last {keep} (--no-crop refuses instead)",
            file=sys.stderr,
        )
    if not apart and not (slide and longest + max_new_tokens > max_len):
        out = generate(model, params, prompts, strategy, max_new_tokens, rng=seed, crop=crop)
        return rows_of(out)
    rng = jax.random.key(seed)
    return [
        continue_text(model, params, p, strategy, max_new_tokens, jax.random.fold_in(rng, i))
        for i, p in enumerate(prompts)
    ]


def rows_of(out) -> list[list[int]]:
    """Each row of a :func:`~tfmjax.decode.generate` result up to its length, on the host."""
    from tfmjax.parallel.processes import to_host

    rows, lengths = to_host((out.tokens, out.lengths))
    return [row[:n] for row, n in zip(rows.tolist(), lengths.tolist(), strict=True)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tfmjax.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("workdir", help="training workdir (or its checkpoints dir, or one step)")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="mesh.KEY=VALUE: the mesh to decode on, e.g. mesh.fsdp=-1 (default: the "
        "checkpoint's mesh, fitted to the devices present)",
    )
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--input",
        action="append",
        help='space-separated task symbols, e.g. "c a b"; plain text for a text task or an '
        "imported model with its tokenizer (repeatable)",
    )
    given.add_argument(
        "--ids",
        action="append",
        help='space-separated token ids, e.g. "464 3290" (repeatable; for models without the '
        "task's vocabulary, such as imported Hugging Face ones, which continue them exactly as "
        "given, 0 included, up to their EOS; a toy-task model puts its BOS first)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="default: the task's longest eval target + 1 (EOS)",
    )
    parser.add_argument(
        "--no-crop",
        action="store_true",
        help="refuse an input longer than the model's context (default: keep its last "
        "tokens that leave room for the new ones, saying how many were dropped)",
    )
    from tfmjax.checkpoint import data_origin
    from tfmjax.decode.options import add_decode_arguments
    from tfmjax.parallel import processes

    add_decode_arguments(parser)
    data_origin.add_argument(parser)
    processes.add_arguments(parser)
    parser.set_defaults(decode=None)
    args = parser.parse_intermixed_args(argv)
    # No --decode: greedy, except for a text task, which samples as its config says.
    args.explicit_decode = args.decode is not None
    args.decode = args.decode or "greedy"
    return args


def load(workdir: str):
    """``(Experiment, params, step)`` of the newest good checkpoint under ``workdir``."""
    from tfmjax.checkpoint import load_for_inference
    from tfmjax.config import Experiment, from_dict

    config, params, step = load_for_inference(workdir)
    experiment = config if isinstance(config, Experiment) else from_dict(config)
    if "params" not in params:  # a bare params tree: make it model.apply's variables
        params = {"params": params}
    return experiment, params, step


def _interrupted(signum, frame):
    """Ctrl-C / SIGTERM: one line, exit 130 / 143 at once (nothing is written; raising
    KeyboardInterrupt inside a jax compile can crash the interpreter)."""
    os.write(2, f"{signal.Signals(signum).name}: interrupted\n".encode())
    os._exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    signals = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = {sig: signal.signal(sig, _interrupted) for sig in signals}
    try:
        return _main(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        print(f"error: --max-new-tokens={args.max_new_tokens} must be >= 1", file=sys.stderr)
        return 2
    from tfmjax.parallel import processes

    return processes.run_joined(args, lambda: _run(args))


def _say(line: str, file=None) -> None:
    """Print ``line`` from process 0 only (the only process, usually)."""
    from tfmjax.parallel.processes import is_main

    if is_main():
        print(line, file=file or sys.stdout, flush=True)


def load_on_mesh(workdir: str, mesh: Sequence[str] = ()):
    """``(Experiment, params, step, placement)`` of the newest good checkpoint under
    ``workdir``, the params restored onto the mesh ``mesh`` (``mesh.*=value`` overrides;
    none: the checkpoint's own, fitted to the devices present); decode under
    ``placement.context()``. The line naming a mesh other than the checkpoint's is printed."""
    from tfmjax.checkpoint import load_on_mesh as restore
    from tfmjax.config import from_dict

    loaded = restore(workdir, mesh)
    if loaded.note:
        _say(loaded.note, sys.stderr)
    params = loaded.params
    if "params" not in params:  # a bare params tree: make it model.apply's variables
        params = {"params": params}
    return from_dict(loaded.config), params, loaded.step, loaded.placement


def _run(args) -> int:
    from tfmjax.checkpoint import CheckpointError
    from tfmjax.decode.options import strategy_from_args
    from tfmjax.parallel.processes import fail, tag

    try:
        strategy = strategy_from_args(args)  # no --decode: the source's default
        strategy = strategy if args.explicit_decode else None
        experiment, params, step, placement = load_on_mesh(args.workdir, args.overrides)
        with placement.context():  # as the training loop evaluates: the mesh and its rules
            if args.ids:
                return _generate_ids(experiment.model, params, args, strategy)
            tokenizer, task, text = _reader(args, experiment, step)
            inputs = [task.canonical_input(t) for t in args.input] if task else args.input
            for line in check_trained_length(task, inputs) if task else ():
                _say(line, sys.stderr)
            news = generate_texts(
                experiment.model, params, tokenizer, inputs, strategy, args.max_new_tokens,
                args.seed, task=task, text=text, crop=not args.no_crop,
            )  # fmt: skip
    except (ValueError, CheckpointError) as err:
        return fail(f"{tag()}error: {err}", 2)  # after a lost peer's line, if one was lost
    for given, new in zip(args.input, news, strict=True):
        _say(given + new if text is not None else f"{given} -> {new}")  # a text task: it goes on
    return 0


def _reader(args, experiment, step: int):
    """``(tokenizer, task, text)`` for :func:`generate_texts`: a text task's saved tokenizer
    (its text never read), an imported model's own, or a toy task's vocabulary."""
    from tfmjax.checkpoint import (
        NO_HF_TOKENIZER,
        hf_tokenizer_of,
        is_imported,
        load_assets,
        open_checkpoint_source,
    )
    from tfmjax.data.sources import is_text
    from tfmjax.data.text import TextParams
    from tfmjax.data.tokenizers import tokenizer_from_dict

    assets = load_assets(args.workdir, step)
    if is_text(experiment.data.task):
        if assets.get("tokenizer") is None:
            raise ValueError(
                f"checkpoint step {step} holds no tokenizer (written by an older tfmjax)"
            )
        text = TextParams.parse(experiment.data.task_params)
        return tokenizer_from_dict(assets["tokenizer"]), None, text
    tokenizer = hf_tokenizer_of(experiment, assets)
    if tokenizer is not None:
        return tokenizer, None, None
    if is_imported(experiment, assets):
        raise ValueError(NO_HF_TOKENIZER)
    accept, data = args.accept_changed_data, experiment.data
    task = open_checkpoint_source(args.workdir, step, data, accept_changed_data=accept).task
    return task.vocab, task, None


def continue_text(model, params, prompt: list[int], strategy, max_new_tokens: int, rng):
    """``max_new_tokens`` ids continuing ``prompt`` (fewer if EOS comes), past the model's
    ``max_len`` too: once the window is full, it slides, keeping the last half of it as the
    next prompt (nanoGPT's sampling crops its context the same way)."""
    import jax

    from tfmjax.decode import generate

    eos = model.config.eos_id
    max_len, keep = model.config.max_len, max(model.config.max_len // 2, 1)
    ids, new = list(prompt), []
    while len(new) < max_new_tokens:
        context = ids if len(ids) < max_len else ids[-keep:]
        n = min(max_new_tokens - len(new), max_len - len(context))
        rng, key = jax.random.split(rng)
        (row,) = rows_of(generate(model, params, [context], strategy, n, rng=key))
        ids, new = ids + row, new + row
        if (eos is not None and eos in row) or not row:
            break
    return new


def _check_prompt_fits(longest: int, max_len: int) -> None:
    """A prompt must leave a position for a new token: ValueError saying so otherwise."""
    if longest >= max_len:
        raise ValueError(
            f"--input has {longest} tokens, which fill the model's model.max_len={max_len} "
            "positions: give a shorter text"
        )


def _generate_ids(model_config: ModelConfig, params, args, strategy) -> int:
    """``--ids``: continue each id list, exactly as given (BOS only if the model prepends it,
    ``model.prompt_bos``), by ``--max-new-tokens`` (default 16) ids or up to and including the
    model's EOS (``model.eos_id``: an imported model's ``eos_token_id``)."""
    from tfmjax.decode import Greedy, generate
    from tfmjax.models import build

    try:
        prompts = [[int(t) for t in text.split()] for text in args.ids]
    except ValueError:
        raise ValueError(f"--ids {args.ids!r} must be space-separated integers") from None
    if not all(prompts):
        raise ValueError('--ids is empty: give space-separated token ids, e.g. "464 3290"')
    model, max_new = build(model_config), args.max_new_tokens or 16
    crop = not args.no_crop
    out = generate(model, params, prompts, strategy or Greedy(), max_new, rng=args.seed, crop=crop)
    for text, row in zip(args.ids, rows_of(out), strict=True):
        _say(f"{text} -> {' '.join(map(str, row))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
