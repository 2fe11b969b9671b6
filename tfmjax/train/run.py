"""Building a run: everything made from an experiment before the first step.

:func:`build_run` checks the task against the model and makes the optimizer, the jitted
step (for the mesh, the state donated) and the evaluator; no files are touched. Builds are
cached per config, so training twice in one process compiles once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import jax
import numpy as np

from tfmjax.config import ConfigError, Experiment
from tfmjax.data.sources import is_text, open_source
from tfmjax.data.user_data import configured_file_digest
from tfmjax.data.vocab import PAD_ID
from tfmjax.evaluation.text_evaluator import make_evaluator
from tfmjax.kernels import traced_with_trailing_padding
from tfmjax.models import FAMILIES, build
from tfmjax.models.checks import InputError, auto_may_run_cudnn
from tfmjax.parallel import Placement
from tfmjax.train.fused_adamw import FusedAdamW
from tfmjax.train.optimizer import make_optimizer
from tfmjax.train.schedules import make_schedule
from tfmjax.train.state import state_shardings
from tfmjax.train.step import (
    jit_train_step,
    jit_train_steps,
    make_train_step,
    stacked_batch_sharding,
)


@dataclasses.dataclass
class Run:
    """Everything built from an experiment before the first step (no files touched)."""

    experiment: Experiment
    source: object  # tfmjax.data.sources: a toy task or a text corpus
    model: object  # deterministic: init and eval
    tx: object
    schedule: object
    train_step: Callable  # jitted for the mesh, state donated
    train_steps: Callable  # n steps in one lax.scan over batches stacked [n, B, ...]; the same
    evaluator: object  # Evaluator or TextEvaluator: (metrics, rows) = evaluator(params)
    tokens_per_step: int  # padded positions per batch (what the step computes on)
    placement: Placement  # the mesh, the rules, the batch layout
    state_shardings: object  # a TrainState of shardings
    step_fn: Callable | None = None  # the pure step, not jitted (tfmjax.train.stacked vmaps it)

    def batch(self, step: int, rows: slice | None = None) -> dict:
        """Batch ``step`` (host arrays): the global batch, or ``rows`` of it."""
        exp = self.experiment
        return self.source.batch(
            batch_format=self.model.batch_format,
            batch_size=exp.data.batch_size,
            seed=exp.train.seed,
            step=step,
            rows=rows,
        )

    def checked_batch(self, step: int, rows: slice | None = None) -> dict:
        """:meth:`batch`, checked on the host as every batch a step takes: ids, lengths and,
        where the step may run cuDNN, padding that only trails (``model.check_batch``)."""
        batch = self.batch(step, rows)
        self.model.check_batch(batch, auto_may_run_cudnn(self.experiment.model))
        return batch

    def device_batch(self, step: int) -> dict:
        """Batch ``step`` as global arrays split over the mesh's batch axes: each process
        builds and puts only the rows its own devices hold (checked like any batch)."""
        rows = self.checked_batch(step, self.placement.local_rows(self.experiment.data.batch_size))
        return self.placement.put_batch(rows)

    def device_batches(self, first: int, end: int) -> dict:
        """Batches ``first .. end - 1`` stacked ``[end - first, B, ...]`` as global arrays, the
        rows (dim 1) split over the mesh's batch axes: each process builds, checks and puts
        only its own rows of each batch, as :meth:`device_batch` does."""
        size = self.experiment.data.batch_size
        rows = self.placement.local_rows(size)
        parts = []
        for step in range(first, end):
            parts.append(self.checked_batch(step, rows))
        sharding = stacked_batch_sharding(self.placement)
        stacked = {key: np.stack([np.asarray(p[key]) for p in parts]) for key in parts[0]}
        return {
            key: jax.make_array_from_process_local_data(
                sharding, local, (end - first, size, *local.shape[2:])
            )
            for key, local in stacked.items()
        }


def _source(experiment: Experiment, model):
    """The task or corpus, checked against the model: one-line ConfigError for a mismatch."""
    data = experiment.data
    if model.batch_format is None:
        trainable = ", ".join(name for name, cls in FAMILIES.items() if cls.batch_format)
        raise ConfigError(
            f"model.family={model.family!r} cannot be trained on a toy task; use one of {trainable}"
        )
    if model.batch_format == "masked_lm" and not is_text(data.task):
        raise ConfigError(
            f"model.family={model.family!r} trains as a masked LM, on text only: set data.task "
            "to a text corpus such as 'shakespeare' (configs/shakespeare_mlm.toml)"
        )
    try:
        source = open_source(data.task, data.task_params)
        if not is_text(data.task):
            model.check_task_padding(PAD_ID)
    except ValueError as err:
        raise ConfigError(f"data.task={data.task!r}: {err}") from None
    if model.batch_format not in source.batch_formats:
        raise ConfigError(
            f"data.task={data.task!r} serves {', '.join(source.batch_formats)} batches; this "
            f"model trains on {model.batch_format!r} batches (images need model.input="
            "'patches', tokens model.input='tokens')"
        )
    vocab_size = experiment.model.vocab_size
    if vocab_size < source.vocab_size:
        raise ConfigError(
            f"model.vocab_size={vocab_size} is smaller than the vocabulary "
            f"of task {data.task!r} ({source.vocab_size} ids); set model.vocab_size "
            f">= {source.vocab_size}"
        )
    _check_digits(experiment.model, source.digit_ids, data.task)
    return source


def _check_digits(m, digit_ids: tuple[int, ...], task: str) -> None:
    """``model.position = "abacus"`` needs a task with digits, at ``model.digit_first_id``."""
    if m.position != "abacus":
        return
    if not digit_ids:
        raise ConfigError(
            f"model.position='abacus' gives digits their place in a number, but data.task="
            f"{task!r} has no digits: use addition, addition_reversed, or copy, reverse or sort "
            "with 10 symbols, or another position"
        )
    if tuple(digit_ids) != tuple(range(m.digit_first_id, m.digit_first_id + 10)):
        raise ConfigError(
            f"model.digit_first_id={m.digit_first_id} does not match data.task={task!r}, whose "
            f"digits 0-9 are ids {list(digit_ids)}; set model.digit_first_id={digit_ids[0]}"
        )


_RUNS: dict[str, Run] = {}  # the last few builds, so training twice in one process compiles once
_MAX_RUNS = 2


def _run_key(experiment: Experiment) -> str:
    """Everything that shapes the compiled functions and the data: the config minus its
    name, workdir and the loop's settings (``train_steps`` compiles once per number of steps,
    whatever K), and the bytes of an own task or text file (edited, it is opened again)."""
    raw = experiment.to_dict()
    raw["name"], raw["train"]["workdir"] = "", ""
    raw["train"]["steps_per_call"] = raw["train"]["prefetch"] = None
    return json.dumps([raw, configured_file_digest(experiment.data.task)], sort_keys=True)


def build_run(experiment: Experiment) -> Run:
    """Task, model, optimizer, jitted step and evaluator; ConfigError if they do not fit.

    Cached per config (name and workdir aside): a second ``train`` in the same process
    with the same config (a resume, a test) reuses the compiled step and evaluator.
    """
    key = _run_key(experiment)
    if key not in _RUNS:
        while len(_RUNS) >= _MAX_RUNS:
            _RUNS.pop(next(iter(_RUNS)))
        _RUNS[key] = _build_run(experiment)
    return dataclasses.replace(_RUNS[key], experiment=experiment)


def schedule_span(experiment: Experiment) -> int:
    """The steps a decaying schedule spans: ``optim.schedule_steps``, or ``train.steps``."""
    return experiment.optim.schedule_steps or experiment.train.steps


# The numbers runs of one program may differ in (besides train.seed): none changes a shape,
# so tfmjax.train.stacked gives each run its own as a traced array (make_training's hyper).
HYPERPARAMETERS = (
    "optim.learning_rate",
    "optim.weight_decay",
    "optim.warmup_steps",
    "optim.label_smoothing",
    "model.dropout_rate",
)


def hyperparameters(experiment: Experiment) -> dict:
    """The experiment's :data:`HYPERPARAMETERS`, by key: ``{"optim.learning_rate": 3e-3, ...}``."""
    sections = {"optim": experiment.optim, "model": experiment.model}
    return {key: getattr(sections[key.split(".")[0]], key.split(".")[1]) for key in HYPERPARAMETERS}


def make_run_schedule(experiment: Experiment, hyper: dict | None = None):
    """The learning-rate schedule: one-line ConfigError for settings that do not fit.
    ``hyper``: :data:`HYPERPARAMETERS` in place of the config's (see :func:`make_training`)."""
    m, o, t = experiment.model, experiment.optim, experiment.train
    h = {**hyperparameters(experiment), **(hyper or {})}
    try:
        return make_schedule(
            o.schedule,
            peak_lr=h["optim.learning_rate"],
            warmup_steps=h["optim.warmup_steps"],
            total_steps=schedule_span(experiment),
            d_model=m.d_model,
            end_lr=o.end_learning_rate,
            decay_fraction=o.decay_fraction,
        )
    except ValueError as err:
        span_key = "optim.schedule_steps" if o.schedule_steps else "train.steps"
        span_value = schedule_span(experiment)
        if span_value < o.warmup_steps:  # the decaying schedules' one check of the span
            raise ConfigError(
                f"{span_key}={span_value} is shorter than optim.warmup_steps={o.warmup_steps}, "
                f"which optim.schedule={o.schedule!r} finishes before it decays: set "
                f"{span_key} >= {o.warmup_steps} or optim.warmup_steps <= {span_value}"
            ) from None
        span = f"optim.schedule_steps={o.schedule_steps}" if o.schedule_steps else ""
        raise ConfigError(
            f"optim.schedule={o.schedule!r} with optim.warmup_steps={o.warmup_steps} "
            f"and {span or f'train.steps={t.steps}'}: {err}"
        ) from None


def one_device(experiment: Experiment) -> bool:
    """Whether the run's mesh is one device (every ``[mesh]`` axis 1, the default): then the
    optimizer keeps its moments in flat buffers (:class:`FusedAdamW`, fewer kernels to
    compile), which a mesh would have to shard as a whole; on a mesh every moment is sharded
    like its parameter (Optax's AdamW). Checkpoints hold Optax's layout either way."""
    mesh = experiment.mesh
    return (mesh.data, mesh.fsdp, mesh.tensor, mesh.expert) == (1, 1, 1, 1)


def make_training(experiment: Experiment, hyper: dict | None = None) -> tuple:
    """``(schedule, tx, step)``: the schedule, the optimizer and the pure train step.

    ``hyper`` maps some :data:`HYPERPARAMETERS` to values in place of the config's: traced
    per-run arrays when :mod:`tfmjax.train.stacked` builds the step inside ``jax.vmap``
    (the builders take arrays where they take these numbers). Without it, the numbers are the
    config's Python floats, the plain run's step."""
    m, o = experiment.model, experiment.optim
    h = {**hyperparameters(experiment), **(hyper or {})}
    schedule = make_run_schedule(experiment, h)
    optimizer = FusedAdamW if one_device(experiment) else make_optimizer
    tx = optimizer(
        schedule=schedule,
        weight_decay=h["optim.weight_decay"],
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        clip_norm=o.clip_norm,
    )
    dropout = (hyper or {}).get("model.dropout_rate")  # None: the config's
    step = make_train_step(
        build(m, deterministic=False, dropout_rate=dropout),
        tx,
        schedule,
        label_smoothing=h["optim.label_smoothing"],
        grad_accum_steps=o.grad_accum_steps,
        loss_chunk=experiment.train.loss_chunk,
    )
    if auto_may_run_cudnn(m):  # every batch is checked for it (Run.device_batch)
        step = traced_with_trailing_padding(step)
    return schedule, tx, step


def _build_run(experiment: Experiment) -> Run:
    m, t, d = experiment.model, experiment.train, experiment.data
    model = build(m)
    source = _source(experiment, model)
    schedule, tx, step = make_training(experiment)
    try:
        evaluator = make_evaluator(m, source, batch_size=d.batch_size, num_examples=d.eval_examples)
    except (ValueError, InputError) as err:
        raise ConfigError(str(err)) from None
    if t.best_metric not in evaluator.metric_names:
        raise ConfigError(
            f"train.best_metric={t.best_metric!r} is not measured on data.task={d.task!r}; "
            f"use one of {', '.join(evaluator.metric_names)}"
        )
    placement = Placement.for_run(experiment)
    sample = source.batch(
        batch_format=model.batch_format, batch_size=d.batch_size, seed=t.seed, step=0
    )
    try:
        model.check_batch(sample, auto_may_run_cudnn(m))
    except InputError as err:
        raise ConfigError(str(err)) from None
    shardings = state_shardings(model, tx, sample, t.seed, placement)
    return Run(
        experiment,
        source,
        model,
        tx,
        schedule,
        jit_train_step(step, placement, shardings),
        jit_train_steps(step, placement, shardings),
        evaluator,
        model.positions_in(sample),
        placement,
        shardings,
        step,
    )
