"""The training loop: the only impure code (files, signals, clocks, console).

``train(experiment)`` resumes from the newest good checkpoint in ``experiment.workdir``
(or starts fresh), runs ``train.steps`` updates and writes, under the workdir:
``metrics.jsonl``, ``checkpoints/<step>/``, ``metrics.png`` and (if asked) ``tensorboard/``.

Exact resume: batch ``s`` is ``make_batch(seed, step=s)`` and its dropout key is
``fold_in(root, s)``; the log window's running sums live in the state; ``metrics.jsonl`` is
cut back to the resumed step. So a run stopped anywhere and resumed ends with the same
params (bit for bit) and the same records (apart from their ``timing``) as a straight run.

Many processes (:mod:`tfmjax.parallel.processes`): every process runs this loop on its part
of the mesh; process 0 alone prints, writes ``metrics.jsonl`` and plots; every process takes
part in checkpoint saves; a signal to any process stops all of them after the same step.

SIGTERM / Ctrl-C (:class:`StopSignals`): the current step finishes, the state is saved, the
save is waited for, and ``train`` returns with ``stopped=True``; a signal that came before
the first step (while building or restoring; ``train.py`` catches them from its start)
raises :class:`Interrupted` instead, nothing saved. A second Ctrl-C interrupts at once
(``train.py``: exits 130).
A non-finite loss raises :class:`NonFiniteLossError` without saving anything more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax

from tfmjax.checkpoint import Checkpointer, load_config
from tfmjax.config import LOWER_IS_BETTER, ConfigError, Experiment
from tfmjax.data.sources import is_text, open_source
from tfmjax.models import FAMILIES, build
from tfmjax.models.checks import InputError
from tfmjax.models.summary import summarize
from tfmjax.parallel import Placement, mesh_text
from tfmjax.parallel.processes import any_process, is_main, to_host
from tfmjax.text_evaluator import make_evaluator
from tfmjax.train.metrics_log import Console, MetricsLog, NullLog
from tfmjax.train.optimizer import make_optimizer
from tfmjax.train.resume import check_resume
from tfmjax.train.schedules import make_schedule
from tfmjax.train.state import (
    abstract_state,
    count_params,
    create_state,
    reset_window,
    state_shardings,
    with_params_from,
)
from tfmjax.train.step import jit_train_step, make_train_step, window_means


class NonFiniteLossError(RuntimeError):
    """Training produced a non-finite loss or gradient; nothing after it was saved."""


@dataclasses.dataclass
class Run:
    """Everything built from an experiment before the first step (no files touched)."""

    experiment: Experiment
    source: object  # tfmjax.data.sources: a toy task or a text corpus
    model: object  # deterministic: init and eval
    tx: object
    schedule: object
    train_step: Callable  # jitted for the mesh, state donated
    evaluator: object  # Evaluator or TextEvaluator: (metrics, rows) = evaluator(params)
    tokens_per_step: int  # padded positions per batch (what the step computes on)
    placement: Placement  # the mesh, the rules, the batch layout
    state_shardings: object  # a TrainState of shardings

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

    def device_batch(self, step: int) -> dict:
        """Batch ``step`` as global arrays split over the mesh's batch axes: each process
        builds and puts only the rows its own devices hold (checked like any batch)."""
        rows = self.batch(step, self.placement.local_rows(self.experiment.data.batch_size))
        self.model.check_batch(rows)
        return self.placement.put_batch(rows)


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
    except ValueError as err:
        raise ConfigError(f"data.task={data.task!r}: {err}") from None
    vocab_size = experiment.model.vocab_size
    if vocab_size < source.vocab_size:
        raise ConfigError(
            f"model.vocab_size={vocab_size} is smaller than the vocabulary "
            f"of task {data.task!r} ({source.vocab_size} ids); set model.vocab_size "
            f">= {source.vocab_size}"
        )
    return source


_RUNS: dict[str, Run] = {}  # the last few builds, so training twice in one process compiles once
_MAX_RUNS = 2


def _run_key(experiment: Experiment) -> str:
    """Everything that shapes the compiled functions: the config minus its name and workdir."""
    raw = experiment.to_dict()
    raw["name"], raw["train"]["workdir"] = "", ""
    return json.dumps(raw, sort_keys=True)


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


def _build_run(experiment: Experiment) -> Run:
    m, o, t, d = experiment.model, experiment.optim, experiment.train, experiment.data
    model = build(m)
    source = _source(experiment, model)
    try:
        schedule = make_schedule(
            o.schedule,
            peak_lr=o.learning_rate,
            warmup_steps=o.warmup_steps,
            total_steps=t.steps,
            d_model=m.d_model,
            end_lr=o.end_learning_rate,
            decay_fraction=o.decay_fraction,
        )
    except ValueError as err:
        raise ConfigError(
            f"optim.schedule={o.schedule!r} with optim.warmup_steps={o.warmup_steps} "
            f"and train.steps={t.steps}: {err}"
        ) from None
    try:
        evaluator = make_evaluator(m, source, batch_size=d.batch_size, num_examples=d.eval_examples)
    except (ValueError, InputError) as err:
        raise ConfigError(str(err)) from None
    if t.best_metric not in evaluator.metric_names:
        raise ConfigError(
            f"train.best_metric={t.best_metric!r} is not measured on data.task={d.task!r}; "
            f"use one of {', '.join(evaluator.metric_names)}"
        )
    tx = make_optimizer(
        schedule=schedule,
        weight_decay=o.weight_decay,
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        clip_norm=o.clip_norm,
    )
    step = make_train_step(
        build(m, deterministic=False),
        tx,
        schedule,
        label_smoothing=o.label_smoothing,
        grad_accum_steps=o.grad_accum_steps,
    )
    placement = Placement.for_run(experiment)
    sample = source.batch(
        batch_format=model.batch_format, batch_size=d.batch_size, seed=t.seed, step=0
    )
    try:
        model.check_batch(sample)
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
        evaluator,
        sum(int(sample[key].size) for key in model.token_keys),
        placement,
        shardings,
    )


class Interrupted(Exception):
    """SIGINT/SIGTERM came before the first step of this process finished: nothing saved.

    ``exit_code``: 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signame: str, start: int = 0):
        kept = f" (checkpoint step {start} is kept)" if start else ""
        super().__init__(f"{signame}: interrupted before the first step: nothing saved{kept}")
        self.signame = signame
        self.exit_code = 128 + signal.Signals[signame].value


_EXITING = threading.Lock()


def _exit_now() -> None:
    """A second Ctrl-C: one line and exit 130 at once, from the handler or a thread.

    No cleanup runs: a checkpoint being written stays an orbax tmp dir, which the next
    run removes (saves are atomic, so the newest finished step is intact).
    """
    if not _EXITING.acquire(blocking=False):
        return  # the handler and the watcher both saw it: the other one exits
    try:
        os.write(2, b"second Ctrl-C: exiting now; the last saved checkpoint is intact\n")
    finally:
        os._exit(130)


class StopSignals:
    """SIGTERM and the first Ctrl-C set a flag (``requested``) that is checked at safe
    points: before the first step (:class:`Interrupted`) and after every step (save, stop).

    The handler only sets the flag, so it never raises inside XLA (compiling) or Orbax
    (saving). A second Ctrl-C raises KeyboardInterrupt (a library call, e.g. in a notebook)
    or, with ``exit_on_second`` (``train.py``), exits 130 at once: in the handler, or, while
    the main thread is inside a long C++ call (an XLA compile) where Python handlers wait,
    from a thread that reads the signal wakeup fd, armed by the first signal. Nested
    (``train.py`` enters one before building the run, ``train`` its own), the inner one
    shares the outer one's flag.
    """

    _active: StopSignals | None = None

    def __init__(self, *, exit_on_second: bool = False):
        self.requested: str | None = None
        self.exit_on_second = exit_on_second
        self._previous = {}
        self._outer: StopSignals | None = None
        self._wakeup: tuple[int, int] | None = None  # (write fd, previous wakeup fd)

    def __enter__(self):
        if StopSignals._active is not None:
            self._outer = StopSignals._active
            return self._outer
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
            StopSignals._active = self
        return self

    def take(self, signame: str | None) -> None:
        """Adopt a signal caught before this was installed (by ``train.py``'s first handler)."""
        if signame and not self.requested:
            self.requested = signame
            self._arm()

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:  # a second Ctrl-C
            if not self.exit_on_second:
                raise KeyboardInterrupt
            _exit_now()
        if not self.requested:
            self.requested = signal.Signals(signum).name
            self._arm()

    def _arm(self) -> None:
        """From now on any Ctrl-C exits at once, even while a C++ call holds the main thread."""
        if not self.exit_on_second or self._wakeup is not None or not self._previous:
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            os.close(read)
            os.close(write)
            return
        self._wakeup = (write, previous)
        threading.Thread(target=_watch, args=(read,), name="second-ctrl-c", daemon=True).start()

    def __exit__(self, *exc):
        if self._outer is not None:
            self._outer = None
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if StopSignals._active is self:
            StopSignals._active = None
        if self._wakeup is not None:
            write, previous = self._wakeup
            signal.set_wakeup_fd(previous)
            os.close(write)  # the watcher reads EOF and ends
            self._wakeup = None


def _watch(read: int) -> None:
    """The armed watcher: the C-level handler writes each signal's number to the wakeup fd."""
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while data := pipe.read(64):
            if signal.SIGINT.value in data:
                _exit_now()


def _agreed_stop(stop: StopSignals) -> str | None:
    """The signal any process got (all processes stop after the same step), or None."""
    if jax.process_count() == 1:
        return stop.requested
    number = any_process(signal.Signals[stop.requested].value if stop.requested else 0)
    return signal.Signals(number).name if number else None


def _check_finite(state, last_saved: int | None) -> None:
    nonfinite, first = jax.device_get((state.window["nonfinite"], state.window["first_nonfinite"]))
    if nonfinite:
        kept = (
            f"the last checkpoint (step {last_saved}) is untouched"
            if last_saved
            else "no checkpoint was written"
        )
        raise NonFiniteLossError(
            f"non-finite loss or gradient at step {int(first) + 1}: training stopped and this "
            f"state was not saved; {kept}. Lower optim.learning_rate, raise optim.warmup_steps "
            "or set optim.clip_norm"
        )


@dataclasses.dataclass
class _Window:
    """Wall-clock bookkeeping of the current log window (never enters the state)."""

    start: float = dataclasses.field(default_factory=time.perf_counter)
    steps: int = 0

    def timing(self, tokens_per_step: int, elapsed: float) -> dict:
        seconds = max(time.perf_counter() - self.start, 1e-9)
        return {
            "tokens_per_sec": self.steps * tokens_per_step / seconds,
            "steps_per_sec": self.steps / seconds,
            "elapsed_sec": elapsed,
        }


class _Loop:
    """One call of :func:`train`: the state plus the files, clocks and console it writes."""

    def __init__(
        self,
        run: Run,
        console: Console,
        log: MetricsLog,
        ckpt: Checkpointer,
        last_saved: int | None,
        on_step: Callable | None,
    ):
        self.run, self.console, self.log, self.ckpt = run, console, log, ckpt
        self.last_saved, self.on_step = last_saved, on_step
        self.started = time.perf_counter()
        self.window = _Window()
        self.last_eval: dict | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def log_train(self, state, step: int):
        _check_finite(state, self.last_saved)
        record = {
            "step": step,
            "split": "train",
            **window_means(jax.device_get(state.window)),
            "timing": self.window.timing(self.run.tokens_per_step, self.elapsed()),
        }
        self.log.write(record)
        self.console.record(record)
        self.window = _Window()
        return reset_window(state, self.run.state_shardings.window)

    def evaluate(self, state, step: int) -> None:
        with self.run.placement.context():  # batch over data, heads over tensor
            metrics, rows = self.run.evaluator(state.params)
        timing = dict(metrics.pop("timing"), elapsed_sec=self.elapsed())
        record = {"step": step, "split": "eval", **metrics, "timing": timing}
        if is_text(self.run.experiment.data.task):
            record["samples"] = rows  # sampled continuations or masked-LM fill-ins
        self.log.write(record)
        self.console.record(record)
        self.last_eval = {
            k: v for k, v in record.items() if k not in ("timing", "split", "samples")
        }
        self.window.start += timing["eval_sec"]  # eval time is not training time

    def save(self, state, step: int, metrics: dict | None) -> None:
        _check_finite(state, self.last_saved)
        begin = time.perf_counter()
        self.ckpt.save(
            step,
            state,
            config=self.run.experiment.to_dict(),
            metrics=metrics,
            assets=self.run.source.assets(),
        )
        self.last_saved = step
        self.window.start += time.perf_counter() - begin

    def first_step(self, state, batch):
        """Run (and time) the first step of this process: compilation happens here."""
        begin = time.perf_counter()
        state, _ = self.run.train_step(state, batch)
        jax.block_until_ready(state)
        self.console.print(f"compiled and ran the first step in {time.perf_counter() - begin:.1f}s")
        self.window = _Window()
        return state

    def run_steps(self, state, start: int, stop: StopSignals):
        requested = _agreed_stop(stop)
        if requested:  # came while building, restoring or initializing: nothing to save
            raise Interrupted(requested, start)
        t = self.run.experiment.train
        if start >= t.steps:
            self.console.print(
                f"the run in {self.run.experiment.workdir} finished at step {start} "
                f"(train.steps={t.steps}): nothing to do; to train longer, rerun with "
                f"train.steps={2 * start}"
            )
            return state, start, False
        for step in range(start, t.steps):
            self.window.steps += 1
            batch = self.run.device_batch(step)
            if step == start:
                state = self.first_step(state, batch)
            else:
                state, _ = self.run.train_step(state, batch)
            done = step + 1
            self.console.step()
            if self.on_step is not None:
                self.on_step(done)
            state = self.at_step_end(state, done)
            requested = _agreed_stop(stop)
            if requested:
                if self.last_saved != done:
                    self.save(state, done, None)
                self.console.print(
                    f"{requested}: saved step {done}; stopping; rerun the same command to resume"
                )
                return state, done, True
        return state, t.steps, False

    def at_step_end(self, state, done: int):
        t = self.run.experiment.train
        last = done == t.steps
        if done % t.log_every == 0 or last:
            state = self.log_train(state, done)
        evaluated = done % t.eval_every == 0 or last
        if evaluated:
            self.evaluate(state, done)
        if done % t.checkpoint_every == 0 or last:
            self.save(state, done, self.last_eval if evaluated else None)
        return state


def _header(run: Run, params, start: int, console: Console) -> None:
    exp = run.experiment
    console.print(summarize(exp.model))
    console.print(
        f"experiment {exp.name}: {exp.model.family} on task {exp.data.task}, "
        f"{count_params(params):,} parameters, batch {exp.data.batch_size}, "
        f"{exp.train.steps} steps; workdir {exp.workdir}"
    )
    mesh = mesh_text(run.placement.mesh.shape)
    used, available = run.placement.mesh.size, jax.device_count()
    hint = "" if used == available else "; mesh.data=-1 (or fsdp, tensor) uses them all"
    console.print(f"mesh {mesh}: {used} of {available} {jax.default_backend()} devices{hint}")
    if start:
        console.print(f"resumed from checkpoint step {start}")


def _restore(run: Run, ckpt: Checkpointer, sample: dict, override: bool):
    """``(state, step, changes)``: the newest good checkpoint (or a fresh state, step 0) and
    the config changes this resume applies (see :mod:`tfmjax.train.resume`)."""
    exp = run.experiment
    target = abstract_state(run.model, run.tx, sample, exp.train.seed, run.state_shardings)
    latest = ckpt.latest_step()
    if latest is None:
        state = create_state(run.model, run.tx, sample, exp.train.seed, run.state_shardings)
        if exp.train.init_from:
            state, _ = with_params_from(state, exp.train.init_from, run.tx)
            # via the host: the loaded params sit on one device, the mesh may span processes
            state = jax.device_put(to_host(state), run.state_shardings)
        return state, 0, []
    saved = load_config(ckpt.directory)
    applied = check_resume(saved, exp, latest, override=override)
    state, step = ckpt.restore(target, config=None if override else exp.to_dict())
    return state, step, applied


def train(
    experiment: Experiment,
    *,
    stream=None,
    progress: bool | None = None,
    on_step: Callable[[int], None] | None = None,
    plot: bool = True,
    override_config: bool = False,
) -> dict:
    """Train (or resume) ``experiment``; returns ``{"step", "stopped", "eval", "workdir"}``.

    ``progress``: a tqdm bar (None: only on a TTY). ``on_step(step)`` is called after each
    step (tests use it to inject failures). A workdir that holds a run resumes it; a changed
    config is applied or refused as :mod:`tfmjax.train.resume` says (``override_config``
    continues with any change and records it). Raises ConfigError, CheckpointError,
    NonFiniteLossError.
    """
    run = build_run(experiment)
    workdir = Path(experiment.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t = experiment.train
    ckpt = Checkpointer(
        workdir.resolve(),
        keep=t.keep_checkpoints,
        best_metric=t.best_metric,
        best_mode="min" if t.best_metric in LOWER_IS_BETTER else "max",
    )
    with contextlib.ExitStack() as stack:
        stack.callback(ckpt.close)
        state, start, applied = _restore(run, ckpt, run.batch(0), override_config)
        main = is_main()  # process 0 alone prints and writes metrics
        log = NullLog()
        if main:
            log = MetricsLog(workdir, resume_step=start, tensorboard=t.tensorboard)
        stack.callback(log.close)
        if not main:
            stream = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115
        console = Console(
            total=t.steps, initial=start, stream=stream, progress=progress if main else False
        )
        stack.callback(console.close)
        _header(run, state.params, start, console)
        if applied:
            console.print(f"resuming step {start} with {', '.join(applied)}")
            log.write({"step": start, "split": "config", "changes": applied})
        loop = _Loop(run, console, log, ckpt, start or None, on_step)
        with StopSignals() as stop:
            state, step, stopped = loop.run_steps(state, start, stop)
            ckpt.wait()
    if plot and is_main():
        from tfmjax.train.plots import plot_metrics

        plot_metrics(workdir)
    return {"step": step, "stopped": stopped, "eval": loop.last_eval, "workdir": str(workdir)}
