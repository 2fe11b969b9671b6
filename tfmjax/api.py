"""The Python API for notebooks: a thin face over what ``train.py``, ``eval.py`` and
``python -m tfmjax.generate`` run, handed on as ``tfmjax.*``.

    exp = tfmjax.experiment("configs/reverse.toml", {"train.steps": 300})
    tfmjax.fit(exp)                                  # train.py: resumes, Ctrl-C saves and stops
    m = tfmjax.load(exp.workdir)                     # model, params, config, tokenizer, step
    tfmjax.generate_text(m, "c a b")                 # the answer (or the text that follows)
    tfmjax.generate_ids(m, [[7, 5, 6]])              # ids in, ids out
    tfmjax.evaluate(m)                               # eval.py's metrics on m.params

Training is ``fit`` (``tfmjax.train`` and ``tfmjax.generate`` are the subpackage and module
these call). Errors are the library's one-line ConfigError, CheckpointError, ValueError.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfmjax.config import Experiment, from_overridden
from tfmjax.config import load as load_toml


def _override_strings(overrides) -> list[str]:
    """``{"train.steps": 300}`` or ``["train.steps=300"]`` -> ``["train.steps=300"]``; a dict
    value (``{"data.task_params": {"max_len": 8}}``) becomes one override per nested key."""
    if isinstance(overrides, str):
        raise ValueError(
            f"overrides={overrides!r} must be a dict or a list of 'section.key=value' strings"
        )
    if not isinstance(overrides, Mapping):
        return list(overrides)
    out = []
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            out += _override_strings({f"{key}.{k}": v for k, v in value.items()})
        else:
            out.append(f"{key}={_toml_value(value)}")
    return out


def _toml_value(value) -> str:
    """A Python value as the TOML text an override reads (``parse_value``)."""
    if value is None:
        return "none"
    return json.dumps(value)  # bool, int, float, str and lists of them are TOML too


def experiment(config: str | Path | Mapping, overrides=(), *, name: str | None = None):
    """An :class:`~tfmjax.config.Experiment` from a TOML file or a dict of its sections,
    with ``overrides`` (a dict ``{"section.key": value}`` or ``"section.key=value"`` strings)
    applied as on ``train.py``'s command line. ``name`` (default: the file's stem, or
    ``"experiment"``) names the workdir, ``runs/NAME``, unless ``train.workdir`` is set."""
    items = _override_strings(overrides)
    if isinstance(config, Mapping):
        exp = from_overridden(dict(config), items)  # named by its "name", or "experiment"
    else:
        exp = load_toml(config, items)
    return dataclasses.replace(exp, name=name) if name else exp


def fit(
    exp,
    *,
    override_config: bool = False,
    progress: bool | None = None,
    accept_changed_data: bool = False,
) -> dict:
    """Train (or resume) an experiment, as ``train.py`` does: ``{"step", "stopped", "eval",
    "workdir"}``. ``exp``: an Experiment, or what :func:`experiment` takes. The workdir is
    resumed when it holds a run; Ctrl-C saves, stops and returns ``stopped=True`` (a second
    one raises KeyboardInterrupt). ``progress``: a tqdm bar (None: only on a terminal).
    ``accept_changed_data``: resume although an own task or text file changed since the
    checkpoint (refused otherwise)."""
    from tfmjax.train.loop import train

    if not isinstance(exp, Experiment):
        exp = experiment(exp)
    accept = accept_changed_data
    return train(
        exp, progress=progress, override_config=override_config, accept_changed_data=accept
    )


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A checkpoint ready to use: ``model.apply(params, batch)``; :func:`generate_text`,
    :func:`generate_ids`, :func:`evaluate` take it whole."""

    model: Any  # the built flax module, dropout off
    params: Any  # model.apply's variables: {"params": ...}
    config: Experiment  # the experiment the checkpoint was trained with
    tokenizer: Any  # a tfmjax.data.tokenizers.Tokenizer (encode, decode, bos/eos/pad_id, size):
    # a toy task's Vocab, a corpus's tokenizer, or an imported model's Hugging Face tokenizer
    # (None when it was imported without one)
    step: int  # the step actually loaded (an older one when the newest is corrupt)
    path: str  # what was loaded: a workdir, its checkpoints dir or one step dir
    source: Any  # the task or corpus (tfmjax.data.sources), for evaluation; None if imported


def load(workdir: str | Path, *, accept_changed_data: bool = False) -> Loaded:
    """The newest good checkpoint under ``workdir`` (or one step dir), on one device: the
    params verified by their hash, the config and tokenizer saved with them, and its data
    (an own task or text file that changed since training: CheckpointError, one line,
    unless ``accept_changed_data``)."""
    from tfmjax.checkpoint import (
        hf_tokenizer_of,
        is_imported,
        load_assets,
        open_checkpoint_source,
    )
    from tfmjax.generate import load as load_checkpoint
    from tfmjax.models import build

    exp, params, step = load_checkpoint(str(workdir))
    assets = load_assets(workdir, step)
    if is_imported(exp, assets):  # trained on no task here: its own tokenizer, if any
        source, tokenizer = None, hf_tokenizer_of(exp, assets)
    else:
        accept = accept_changed_data
        source = open_checkpoint_source(workdir, step, exp.data, accept_changed_data=accept)
        tokenizer = source.task.vocab if hasattr(source, "task") else source.tokenizer
    model = build(exp.model, deterministic=True)
    return Loaded(model, params, exp, tokenizer, step, str(workdir), source)


def _loaded(m) -> Loaded:
    return m if isinstance(m, Loaded) else load(m)


def generate_text(m, text: str | Sequence[str], strategy=None, *, max_new_tokens=None, seed=0):
    """What the model writes after ``text`` (a str, or a list of them: one batch), as
    ``python -m tfmjax.generate WORKDIR --input TEXT`` does: a toy task's answer to its
    symbols (``"c a b"``); the text a corpus's language model or an imported model (with
    its own tokenizer) continues it with. ``strategy``: a :mod:`tfmjax.decode` strategy
    (default ``Greedy()``; a corpus: its task's top-k sampling); ``seed`` for sampling;
    ``m``: :func:`load`'s result or a workdir."""
    from tfmjax.checkpoint import NO_HF_TOKENIZER
    from tfmjax.generate import generate_texts

    m = _loaded(m)
    if m.tokenizer is None:  # an imported model without its tokenizer
        raise ValueError(f"{m.path}: {NO_HF_TOKENIZER} (here: tfmjax.generate_ids)")
    texts = [text] if isinstance(text, str) else list(text)
    task = getattr(m.source, "task", None)  # a toy task; else a corpus (its TextParams) or none
    texts = [task.canonical_input(t) for t in texts] if task else texts
    corpus = None if task or m.source is None else m.source.params
    out = generate_texts(
        m.config.model, m.params, m.tokenizer, texts, strategy, max_new_tokens, seed,
        task=task, text=corpus,
    )  # fmt: skip
    return out[0] if isinstance(text, str) else out


def generate_ids(m, ids: Sequence[Sequence[int]], strategy=None, *, max_new_tokens=16, seed=0):
    """Continue each list of token ids -> the new ids of each, up to and including the
    model's EOS (:func:`tfmjax.decode.generate`: BOS goes first only if the model puts it
    there, ``model.prompt_bos``). ``strategy`` as for :func:`generate_text`."""
    from tfmjax.decode import Greedy, generate
    from tfmjax.generate import rows_of

    m = _loaded(m)
    return rows_of(generate(m.model, m.params, ids, strategy or Greedy(), max_new_tokens, rng=seed))


def evaluate(
    m, *, split="eval", num_examples=None, strategy=None, seed=0, rows=5, accept_changed_data=False
) -> dict:
    """``eval.py``'s metrics of ``m.params`` (as they are now, edited or not), with a few
    example ``rows``: ``{"step", "loss", ..., "examples"}``. ``num_examples`` defaults to
    ``data.eval_examples``; ``strategy`` decodes the answers (default greedy);
    ``accept_changed_data`` is :func:`load`'s, when ``m`` is a path."""
    from tfmjax.evaluation.text_evaluator import make_evaluator

    m = m if isinstance(m, Loaded) else load(m, accept_changed_data=accept_changed_data)
    if m.source is None:
        raise ValueError(
            f"{m.path} holds an imported model, trained on no task here: fine-tune it first, "
            f"or measure its perplexity on a text file: python eval.py {m.path} --text FILE"
        )
    data = m.config.data
    evaluator = make_evaluator(
        m.config.model,
        m.source,
        batch_size=data.batch_size,
        num_examples=num_examples or data.eval_examples,
        split=split,
        strategy=strategy,
        decode_seed=seed,
    )
    metrics, examples = evaluator(m.params, num_rows=rows)
    metrics.pop("timing", None)
    return {"step": m.step, **metrics, "examples": examples}
