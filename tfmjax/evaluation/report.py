"""Evaluate a checkpoint: ``evaluate_checkpoint(path) -> report`` and ``format_report``.

What ``eval.py`` runs: load the params and config a checkpoint holds (the step actually
loaded is the one reported), rebuild the task (a text task with the tokenizer the checkpoint
holds) and score it with :func:`tfmjax.evaluation.text_evaluator.make_evaluator`'s evaluator,
on one device or, restored onto it, on a mesh (the checkpoint's own by default).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from tfmjax.evaluation.evaluator import NUM_ROWS


def evaluate_checkpoint(
    path: str | Path,
    *,
    split: str = "eval",
    num_examples: int | None = None,
    batch_size: int | None = None,
    num_rows: int = NUM_ROWS,
    strategy=None,
    decode_seed: int = 0,
    mesh: Sequence[str] | None = None,
    say: Callable[[str], None] | None = None,
    text: str | Path | None = None,
    accept_changed_data: bool = False,
) -> dict:
    """Evaluate the params of a checkpoint (a workdir, its ``checkpoints`` dir or a step dir).

    ``strategy`` decodes the answers (default ``Greedy()``; see :class:`Evaluator`).
    ``mesh``: None evaluates on this process's first device; a sequence of ``mesh.*=value``
    overrides (empty: the checkpoint's own mesh fitted to the devices present) restores the
    params onto that mesh and evaluates under it, as the training loop does (``eval.py``);
    ``say`` gets one line naming the mesh when it is not the checkpoint's own.
    ``accept_changed_data``: evaluate on an own task or text file that changed since training
    (refused otherwise: :mod:`tfmjax.checkpoint.data_origin`).
    The config comes from the checkpoint. Raises CheckpointError (missing, corrupt) or
    ConfigError (a config, split, size or mesh that does not fit), each with a one-line message.
    ``text``: a text file to score an imported language model on with its own tokenizer
    (:mod:`tfmjax.evaluation.perplexity`); an imported model, which has no task, needs it.
    """
    from tfmjax.checkpoint import (
        load_for_inference,
        load_on_mesh,
        open_checkpoint_source,
        workdir_of,
    )
    from tfmjax.config import ConfigError, from_dict
    from tfmjax.evaluation.text_evaluator import make_evaluator
    from tfmjax.models.checks import InputError
    from tfmjax.parallel.mesh import mesh_text

    path = Path(path)
    context, shape = contextlib.nullcontext(), {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
    if mesh is None:
        config, params, step = load_for_inference(path)
    else:
        loaded = load_on_mesh(path, mesh)
        config, params, step = loaded.config, loaded.params, loaded.step
        context = loaded.placement.context()  # batch over data, heads over tensor
        shape = dict(loaded.placement.mesh.shape)
        if loaded.note and say is not None:
            say(loaded.note)
    experiment = from_dict(config)
    workdir = workdir_of(path)
    data = experiment.data
    tokenizer = _text_tokenizer(path, step, experiment, text)
    if tokenizer is not None:
        with context:
            metrics = _score_text(experiment, params, tokenizer, text, batch_size)
        header = {"task": f"text file {text}", "split": "text", "decode": "teacher-forced"}
        return {
            "checkpoint": str(path),
            "workdir": str(workdir),
            "step": step,
            "experiment": experiment.name,
            "family": experiment.model.family,
            **header,
            "mesh": mesh_text(shape),
            "metric_names": ["loss", "perplexity", "bits_per_char"],
            **metrics,
            "examples": [],
        }
    try:
        source = open_checkpoint_source(path, step, data, accept_changed_data=accept_changed_data)
        evaluator = make_evaluator(
            experiment.model,
            source,
            batch_size=batch_size or data.batch_size,
            num_examples=num_examples or data.eval_examples,
            split=split,
            strategy=strategy,
            decode_seed=decode_seed,
        )
    except (ValueError, InputError) as err:
        raise ConfigError(str(err)) from None
    with context:
        metrics, rows = evaluator(params, num_rows=num_rows)
    return {
        "checkpoint": str(path),
        "workdir": str(workdir),
        "step": step,
        "experiment": experiment.name,
        "family": experiment.model.family,
        "task": data.task,
        "split": split,
        "decode": repr(evaluator.strategy),
        "mesh": mesh_text(shape),
        "metric_names": list(evaluator.metric_names),
        **metrics,
        "examples": rows,
    }


def _text_tokenizer(path, step: int, experiment, text):
    """The tokenizer to score ``text`` with (None: evaluate the task); ConfigError (one line)
    for an imported model without ``text``, or ``text`` where no tokenizer can read it."""
    from tfmjax.checkpoint import hf_tokenizer_of, is_imported, load_assets
    from tfmjax.config import ConfigError

    assets = load_assets(path, step)
    tokenizer = hf_tokenizer_of(experiment, assets)
    if text is None:
        if is_imported(experiment, assets):
            raise ConfigError(
                f"{path} is an imported Hugging Face model, trained on no task here: pass "
                "--text FILE to measure its perplexity on your text, or fine-tune it first"
            )
        return None
    if tokenizer is None:
        if is_imported(experiment, assets):
            raise ConfigError(
                "--text needs the model's tokenizer, and there was no tokenizer.json beside the "
                "weights at import: put it there (tokenizer.save_pretrained) and import again"
            )
        raise ConfigError(
            f"--text scores an imported Hugging Face model; {path} was trained on task "
            f"{experiment.data.task!r}: evaluate it without --text"
        )
    return tokenizer


def _score_text(experiment, params, tokenizer, text, batch_size) -> dict:
    from tfmjax.config import ConfigError
    from tfmjax.evaluation.perplexity import text_perplexity

    try:
        content = Path(text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--text {text}: cannot read it as UTF-8 text ({err})") from None
    try:
        return text_perplexity(
            experiment.model,
            params,
            tokenizer.encode(content),
            len(content),
            batch_size or experiment.data.batch_size,
        )
    except ValueError as err:
        raise ConfigError(f"--text {text}: {err}") from None


def format_report(report: dict) -> str:
    """A printable table: the metrics, then a few input / prediction / target rows."""
    lines = [
        f"checkpoint      {report['checkpoint']} (step {report['step']})",
        f"model / task    {report['family']} / {report['task']}",
        f"split           {report['split']} ({report['num_examples']} examples)",
        f"decode          {report['decode']}",
    ]
    if "mesh" in report:
        lines.append(f"mesh            {report['mesh']}")
    for key in report.get("metric_names", ("loss", "perplexity", "token_accuracy", "exact_match")):
        lines.append(f"{key:<15} {report[key]:.4f}")
    rows = report["examples"]
    if rows and "correct" not in rows[0]:  # a text task: samples or masked-LM fill-ins
        from tfmjax.reporting.console import format_sample

        lines += ["", "samples" if "continuation" in rows[0] else "fill-ins"]
        lines += [format_sample(row, width=1000) for row in rows]
    elif rows:
        width = {
            k: min(40, max(len(k), *(len(r[k]) for r in rows)))
            for k in ("input", "prediction", "target")
        }
        header = "  ".join(f"{k:<{width[k]}}" for k in width)
        lines += ["", header + "  ok", "-" * (len(header) + 4)]
        for r in rows:
            cells = "  ".join(f"{r[k][: width[k]]:<{width[k]}}" for k in width)
            lines.append(f"{cells}  {'yes' if r['correct'] else 'NO'}")
    return "\n".join(lines)


def report_paths(report: dict) -> tuple[Path, Path]:
    """``(WORKDIR/eval/step_N[_SPLIT].json, WORKDIR/eval.json)`` for a report."""
    split = "" if report["split"] == "eval" else f"_{report['split']}"
    workdir = Path(report["workdir"])
    return workdir / "eval" / f"step_{report['step']}{split}.json", workdir / "eval.json"


def write_report(report: dict, out: str | Path | None = None) -> list[Path]:
    """Write ``report`` as JSON; returns the files written.

    ``out`` given: that file only. Otherwise one file per evaluated step
    (``eval/step_N.json``, ``eval/step_N_length.json`` for another split), and ``eval.json``
    too when this is the newest step evaluated on the eval split, so evaluating an older
    step never replaces the final model's report.
    """
    text = json.dumps(report, indent=2) + "\n"
    if out is not None:
        Path(out).write_text(text)
        return [Path(out)]
    per_step, latest = report_paths(report)
    per_step.parent.mkdir(parents=True, exist_ok=True)
    per_step.write_text(text)
    written = [per_step]
    if report["split"] == "eval" and report["step"] >= _step_of(latest):
        latest.write_text(text)
        written.append(latest)
    return written


def _step_of(path: Path) -> int:
    """The step a report file names (-1 when there is none or it cannot be read)."""
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1
