"""Runs that share every shape, trained as one program: ``jax.vmap`` over a run axis of the
states, of the batches and of the numbers they differ in, one jitted call for all of them.

Runs may differ in ``train.seed`` and in the :data:`~tfmjax.train.run.HYPERPARAMETERS`
(learning rate, weight decay, warmup, dropout rate, label smoothing), nothing else
(:func:`stackable`; :func:`group_key` is what they share). The numbers that differ within
the group are per-run float32 arrays, vmapped with the states; the step is built from them
inside the trace by the plain run's own builders (:func:`tfmjax.train.run.make_training`),
which take arrays where they take those numbers. The numbers the runs share stay Python
constants, so a group of seeds compiles the plain step's arithmetic.

:func:`train_stacked` is :func:`tfmjax.train.loop.train` for R runs at once: each run keeps
its own workdir, lock, checkpoints, ``metrics.jsonl``, console and plot (written by the
loop's own :class:`_Loop` methods on that run's slice of the stacked state), so ``eval.py``
reads any of them as a plain run. Each run's initialisation, dropout keys and batches are its
own seed's; only the step runs batched, so its numbers equal the run trained alone up to the
rounding of batched kernels (tested: within 1e-5 relative).

One device (no mesh); every run must resume from the same step (a fresh group: step 0).
A signal stops all of them after the current call, each saved.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.checkpoint import Checkpointer
from tfmjax.checkpoint.lock import WorkdirLock
from tfmjax.config import LOWER_IS_BETTER, ConfigError, Experiment
from tfmjax.reporting.console import Console
from tfmjax.reporting.metrics_log import MetricsLog
from tfmjax.train.loop import _header, _Loop, call_spans
from tfmjax.train.resume import restore
from tfmjax.train.run import HYPERPARAMETERS, build_run, hyperparameters, make_training
from tfmjax.train.step import make_train_steps
from tfmjax.train.stopping import StopSignals


def group_key(experiment: Experiment) -> str:
    """What the runs of one program share, as JSON: ``experiment``'s config without its
    name, workdir, seed and :data:`HYPERPARAMETERS`."""
    raw = experiment.to_dict()
    for key in ("name", "train.workdir", "train.seed", *HYPERPARAMETERS):
        *sections, field = key.split(".")
        del (raw[sections[0]] if sections else raw)[field]
    return json.dumps(raw, sort_keys=True)


def stackable(a: Experiment, b: Experiment) -> bool:
    """Whether ``a`` and ``b`` differ in nothing but ``train.seed``, the
    :data:`HYPERPARAMETERS`, the workdir and the name: one program can train both."""
    return group_key(a) == group_key(b)


def varying(experiments: list[Experiment]) -> dict:
    """The :data:`HYPERPARAMETERS` that differ among ``experiments``: ``{key: float32 [R]}``,
    one value per run, in order (empty for runs that differ only in their seeds)."""
    values = [hyperparameters(e) for e in experiments]
    return {
        key: jnp.asarray([v[key] for v in values], jnp.float32)
        for key in HYPERPARAMETERS
        if len({v[key] for v in values}) > 1
    }


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _take(tree, i: int):
    return jax.tree.map(lambda x: x[i], tree)


_VMAPPED: dict[tuple, object] = {}


def _vmapped_steps(experiment: Experiment, keys: tuple[str, ...]):
    """The train steps of ``experiment``'s group vmapped over the run axis (the state, the
    batches and the values of ``keys``), jitted, the stacked state donated. The numbers not
    in ``keys`` are ``experiment``'s, compiled in as constants (so part of the cache key)."""
    shared = {k: v for k, v in hyperparameters(experiment).items() if k not in keys}
    cache_key = (group_key(experiment), keys, json.dumps(shared, sort_keys=True))
    if cache_key not in _VMAPPED:

        def train_steps(state, batches, hyper: dict):
            _, _, step = make_training(experiment, hyper)
            return make_train_steps(step)(state, batches)

        _VMAPPED.clear()
        _VMAPPED[cache_key] = jax.jit(jax.vmap(train_steps), donate_argnums=0)
    return _VMAPPED[cache_key]


def _open(experiment: Experiment, stack: contextlib.ExitStack, stream=None) -> tuple:
    """One run of the group: built, locked, restored, with its log, console and loop."""
    run = build_run(experiment)
    t = experiment.train
    workdir = Path(experiment.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stack.enter_context(WorkdirLock(workdir))
    mode = "min" if t.best_metric in LOWER_IS_BETTER else "max"
    ckpt = Checkpointer(
        workdir.resolve(), keep=t.keep_checkpoints, best_metric=t.best_metric, best_mode=mode
    )
    stack.callback(ckpt.close)
    state, start, _ = restore(run, ckpt, run.batch(0), False)
    log = MetricsLog(workdir, resume_step=start, tensorboard=t.tensorboard)
    stack.callback(log.close)
    console = Console(total=t.steps, initial=start, stream=stream, progress=False)
    _header(run, state.params, start, console)
    return run, _Loop(run, console, log, ckpt, start or None, None), state, start


def train_stacked(experiments: list[Experiment], *, streams=None, plot: bool = True) -> dict:
    """Train (or resume) :func:`stackable` runs as one program, each printing
    to its own of ``streams`` (default stdout); returns ``{"step", "stopped"}``
    (``stopped``: the signal's name, or False). A signal before the
    first step saves nothing; after it, every run saves the step it reached. ConfigError if
    the runs are not :func:`stackable` or resume from different steps."""
    first = experiments[0]
    for e in experiments[1:]:
        if not stackable(first, e):
            raise ConfigError(
                f"runs trained as one program may differ only in train.seed and "
                f"{', '.join(HYPERPARAMETERS)}; {e.workdir} differs from {first.workdir} "
                "in more"
            )
    with StopSignals() as stop, contextlib.ExitStack() as stack:
        streams = streams or [None] * len(experiments)
        opened = [_open(e, stack, out) for e, out in zip(experiments, streams, strict=True)]
        starts = {o[3] for o in opened}
        if len(starts) > 1:
            raise ConfigError(
                f"the runs resume from different steps {sorted(starts)}; train them as "
                "processes (--executor processes)"
            )
        step = starts.pop()
        if not stop.requested:
            step = _run_steps(opened, step, experiments, stop)
        for loop in (o[1] for o in opened):
            loop.ckpt.wait()
    if plot:
        from tfmjax.train.plots import plot_metrics

        for e in experiments:
            plot_metrics(e.workdir)
    return {"step": step, "stopped": stop.requested or False}


def _run_steps(opened: list[tuple], start: int, experiments, stop: StopSignals) -> int:
    """The calls from ``start`` on, stacked; returns the step reached (saved if stopped)."""
    runs, loops = [o[0] for o in opened], [o[1] for o in opened]
    state = _stack([o[2] for o in opened])
    hyper = varying(experiments)
    steps_fn = _vmapped_steps(experiments[0], tuple(hyper))
    t = experiments[0].train
    step = start
    for lo, hi in call_spans(start, t.steps, t.steps_per_call_on(jax.default_backend())):
        batches = [[run.checked_batch(s) for s in range(lo, hi)] for run in runs]
        stacked = {
            key: np.stack([np.stack([b[key] for b in per_run]) for per_run in batches])
            for key in batches[0][0]
        }
        state, _ = steps_fn(state, stacked, hyper)
        step = hi
        state = _at_step_end(loops, state, lo, hi, t)
        if stop.requested and hi < t.steps:
            for i, loop in enumerate(loops):
                if loop.last_saved != hi:
                    loop.save(_take(state, i), hi, None)
            break
    return step


def _at_step_end(loops, state, first: int, done: int, t):
    """Each run's log, eval and save at ``done`` (on its slice of the stacked state)."""
    for loop in loops:
        loop.window.steps += done - first  # timing only
    due = (
        done % t.log_every == 0
        or done % t.eval_every == 0
        or done % t.checkpoint_every == 0
        or done == t.steps
    )
    if not due:
        return state
    return _stack([loop.at_step_end(_take(state, i), done) for i, loop in enumerate(loops)])
