"""The training loop: the only impure code (files, signals, clocks, console).

``train(experiment)`` resumes from the newest good checkpoint in ``experiment.workdir``
(or starts fresh), runs ``train.steps`` updates and writes, under the workdir:
``metrics.jsonl``, ``checkpoints/<step>/``, ``metrics.png`` and (if asked) ``tensorboard/``.

Exact resume: batch ``s`` is ``make_batch(seed, step=s)`` and its dropout key is
``fold_in(root, s)``; the log window's running sums live in the state; ``metrics.jsonl`` is
cut back to the resumed step. So a run stopped anywhere and resumed ends with the same
params (bit for bit) and the same records (apart from their ``timing``) as a straight run.

Keeping a device busy: ``train.steps_per_call = K`` runs K steps in one jitted call (a
loop over K stacked batches, :func:`call_spans` cuts the run into calls); the log,
evaluation and checkpoint intervals are multiples of K, so records, evaluations and saves
fall between calls, and K = 1 or 10 give the same params and records. The default, ``"auto"``,
is 1 on a CPU and up to 16 on a GPU or TPU (``TrainConfig.steps_per_call_on``; the header
says K).
``train.prefetch`` builds the next calls' batches on a background thread
(:mod:`tfmjax.train.prefetch`). Between log, eval and save steps nothing is fetched from the
device (:data:`STEP_GUARD`): the window sums stay on it until a record is written; the only
wait is ``block_until_ready`` after each call on CPU with several devices here
(:attr:`Placement.waits_each_step`), and with several processes the stop agreement gathers
one small vector every few steps (:class:`StopAgreement`).

Many processes (:mod:`tfmjax.parallel.processes`): every process runs this loop on its part
of the mesh; process 0 alone prints, writes ``metrics.jsonl`` and plots; every process takes
part in checkpoint saves; a signal to any process stops all of them after the same step.

SIGTERM / Ctrl-C (:class:`StopSignals`): the current call finishes (with K = 1, the current
step), the state is saved, the save is waited for, and ``train`` returns with
``stopped=True``; a signal that came before the first step (while building or restoring;
``train.py`` catches them from its start) raises :class:`Interrupted` instead, nothing
saved, and the parts of the workdir the run made go again (:mod:`tfmjax.train.tidy`). A
second Ctrl-C interrupts at once (``train.py``: exits 130, saying what is saved).
A non-finite loss raises :class:`NonFiniteLossError` without saving anything more (found at
the next log or save step, whatever K). An error while building a batch (a bad token id) is
raised before the call that needs the batch, as its one line: that call never runs.

The run is built in :mod:`tfmjax.train.run`, restored in :mod:`tfmjax.train.resume`;
signals are caught in :mod:`tfmjax.train.stopping`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax

from tfmjax.checkpoint import Checkpointer, carried_assets, load_assets
from tfmjax.checkpoint.data_origin import check_same_data
from tfmjax.checkpoint.errors import short_error
from tfmjax.checkpoint.lock import WorkdirLock
from tfmjax.compat import untested_jax
from tfmjax.config import LOWER_IS_BETTER, Experiment
from tfmjax.data.sources import is_text
from tfmjax.data.user_data import unhashable_module
from tfmjax.models.checks import this_platform
from tfmjax.models.summary import summarize
from tfmjax.parallel import mesh_text
from tfmjax.parallel.processes import is_main
from tfmjax.reporting.console import Console
from tfmjax.reporting.metrics_log import MetricsLog, NullLog
from tfmjax.train.kernel_note import attention_note
from tfmjax.train.prefetch import Prefetcher
from tfmjax.train.resume import longer_hint, restore
from tfmjax.train.run import Run, build_run
from tfmjax.train.state import count_params, reset_window, to_saved
from tfmjax.train.step import window_means
from tfmjax.train.stopping import Interrupted, StopAgreement, StopSignals
from tfmjax.train.tidy import Created

# Every call of steps runs inside STEP_GUARD() (taking its batches, the call, on_step): no
# device value is fetched there; logs, evaluations and saves come after it. Tests set a
# device-to-host transfer guard here; a plain run guards nothing.
STEP_GUARD: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


class NonFiniteLossError(RuntimeError):
    """Training produced a non-finite loss or gradient; nothing after it was saved."""


class EvaluationError(RuntimeError):
    """The evaluation inside training failed; the state of that step was saved first."""


def _eval_hint(err: BaseException) -> str:
    """The fix of an evaluation failure we know, or ``""``."""
    if "BF16" in str(err) and jax.default_backend() == "cpu":
        return " (XLA:CPU cannot decode a bfloat16 model at batch > 1: use model.dtype=float32)"
    return ""


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
        carried: dict | None = None,
    ):
        self.run, self.console, self.log, self.ckpt = run, console, log, ckpt
        # Saved with every step: what the run started from carries (an imported model's
        # original config and tokenizer), then the data source's own (a text task's tokenizer).
        self.assets = {**(carried or {}), **run.source.assets()}
        self.last_saved, self.on_step = last_saved, on_step
        self.started = time.perf_counter()
        self.window = _Window()
        self.last_eval: dict | None = None
        self.waits = run.placement.waits_each_step
        self.start = 0  # the step this call of train() started from (set by run_steps)

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
        if is_text(self.run.experiment.data.task):  # a window of text is never matched whole
            record.pop("exact_match")
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
            to_saved(state, self.run.tx),
            config=self.run.experiment.to_dict(),
            metrics=metrics,
            assets=self.assets,
        )
        self.last_saved = step
        self.window.start += time.perf_counter() - begin

    def first_call(self, state, batches, n: int):
        """Run (and time) the first call of this process: compilation happens here."""
        begin = time.perf_counter()
        state, _ = self.run.train_steps(state, batches)
        jax.block_until_ready(state)
        what = "step" if n == 1 else f"{n} steps"
        took = time.perf_counter() - begin
        self.console.print(f"compiled and ran the first {what} in {took:.1f}s")
        self.window = _Window()
        return state

    def advance(self, state, batches, first: int, end: int):
        """Steps ``first + 1 .. end``: one call on the stacked batches ``first .. end - 1``."""
        if first == self.start:
            state = self.first_call(state, batches, end - first)
        else:
            state, _ = self.run.train_steps(state, batches)
            self.window.steps += end - first
        if self.waits:  # XLA:CPU with several devices: one program in flight
            jax.block_until_ready(state)
        for done in range(first + 1, end + 1):
            self.console.step()
            if self.on_step is not None:
                self.on_step(done)
        return state

    def run_steps(self, state, start: int, stop: StopSignals):
        agreement = StopAgreement(stop)
        requested = agreement.check(start)
        if requested:  # came while building, restoring or initializing: nothing to save
            raise Interrupted(requested, start)
        t = self.run.experiment.train
        if start >= t.steps:
            self.console.print(
                f"the run in {self.run.experiment.workdir} finished at step {start} "
                f"(train.steps={t.steps}): nothing to do; {longer_hint(self.run.experiment, start)}"
            )
            return state, start, ""
        self.start = start
        calls = call_spans(start, t.steps, t.steps_per_call_on(jax.default_backend()))
        build = lambda span: self.run.device_batches(*span)  # noqa: E731
        with Prefetcher(build, calls, background=t.prefetch) as batches:
            for first, end in calls:
                with STEP_GUARD():
                    state = self.advance(state, batches.take((first, end)), first, end)
                state = self.at_step_end(state, end)
                requested = agreement.check(end)
                if requested:
                    if self.last_saved != end:
                        self.save(state, end, None)
                    self.console.print(f"{requested}: saving step {end}; stopping")
                    return state, end, requested  # "saved" once the save has finished
        return state, t.steps, ""

    def at_step_end(self, state, done: int):
        t = self.run.experiment.train
        last = done == t.steps
        if done % t.log_every == 0 or last:
            state = self.log_train(state, done)
        evaluated = done % t.eval_every == 0 or last
        if evaluated:
            try:
                self.evaluate(state, done)
            except Exception as err:  # XLA's, or an own task's code: one line, the step kept
                self.save(state, done, None)
                self.ckpt.wait()
                raise EvaluationError(
                    f"the evaluation at step {done} failed ({short_error(err, limit=240)}); "
                    f"step {done} is saved: python eval.py {self.run.experiment.workdir} "
                    f"evaluates it once that is fixed{_eval_hint(err)}"
                ) from None
        if done % t.checkpoint_every == 0 or last:
            self.save(state, done, self.last_eval if evaluated else None)
        return state


def call_spans(start: int, steps: int, k: int) -> list[tuple[int, int]]:
    """The calls from step ``start`` to ``steps``: ``(first, end)`` pairs, each call ending at
    the next multiple of ``k`` or at ``steps``, so a resume from any step realigns and the
    last call of a run whose length is not a multiple of ``k`` is shorter."""
    spans, first = [], start
    while first < steps:
        end = min((first // k + 1) * k, steps)
        spans.append((first, end))
        first = end
    return spans


def dtype_note(backend: str, dtype: str) -> str:
    """A line for a float32 run on an accelerator (the default, chosen for CPUs and for the
    same numbers on every machine), where bfloat16 computes several times faster."""
    if backend in ("gpu", "tpu") and dtype == "float32":
        return (
            f"note: model.dtype=float32 on {backend}: model.dtype=bfloat16 computes in bfloat16 "
            "(parameters and optimizer state stay float32), as the README's GPU figures did"
        )
    return ""


def _header(run: Run, params, start: int, console: Console) -> None:
    exp = run.experiment
    console.print(summarize(exp.model))
    k = exp.train.steps_per_call_on(jax.default_backend())
    auto = " by train.steps_per_call=auto" if exp.train.steps_per_call == "auto" else ""
    per_call = f" ({k} a call{auto})" if k > 1 else ""
    console.print(
        f"experiment {exp.name}: {exp.model.family} on task {exp.data.task}, "
        f"{count_params(params):,} parameters, batch {exp.data.batch_size}, "
        f"{exp.train.steps} steps{per_call}; workdir {exp.workdir}"
    )
    mesh = mesh_text(run.placement.mesh.shape)
    used, available = run.placement.mesh.size, jax.device_count()
    hint = "" if used == available else "; mesh.data=-1 (or fsdp, tensor) uses them all"
    console.print(f"mesh {mesh}: {used} of {available} {jax.default_backend()} devices{hint}")
    kinds = ", ".join(sorted({device.device_kind for device in run.placement.mesh.devices.flat}))
    console.print(f"devices: {kinds}; " + (untested_jax() or f"jax {jax.__version__}"))
    if note := dtype_note(jax.default_backend(), exp.model.dtype):
        console.print(note)
    platform = this_platform()
    if platform != "cpu" and run.model.token_keys:  # no batch built for it on a CPU
        first = run.batch(0)
        widths = tuple(first[key].shape[1] for key in run.model.token_keys)
        kind = run.placement.mesh.devices.flat[0].device_kind
        if note := attention_note(exp.model, widths, platform, kind):
            console.print(note)
    if start:
        console.print(f"resumed from checkpoint step {start}")
    elif note := unhashable_module(run.source.assets().get("task_origin")):
        console.print(note)


def train(
    experiment: Experiment,
    *,
    stream=None,
    progress: bool | None = None,
    on_step: Callable[[int], None] | None = None,
    plot: bool = True,
    override_config: bool = False,
    accept_changed_data: bool = False,
) -> dict:
    """Train (or resume) ``experiment``; returns ``{"step", "stopped", "eval", "workdir"}``.

    ``progress``: a tqdm bar (None: only on a TTY). ``on_step(step)`` is called after each
    step (tests use it to inject failures). A workdir that holds a run resumes it; a changed
    config is applied or refused as :mod:`tfmjax.train.resume` says (``override_config``
    continues with any change and records it), and an own task or text file that changed
    since the checkpoint is refused unless ``accept_changed_data``
    (:mod:`tfmjax.checkpoint.data_origin`). Raises ConfigError, CheckpointError,
    NonFiniteLossError, EvaluationError (an evaluation failed; its step was saved first).
    """
    run = build_run(experiment)
    workdir = Path(experiment.workdir)
    created = Created(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    owned = False  # this process holds the workdir's lock: what it made is its own
    try:
        with contextlib.ExitStack() as held:
            if is_main():  # one run per workdir; the processes of one run share it
                lock = held.enter_context(WorkdirLock(workdir))
                owned = True
                if lock.unsupported:
                    print(f"{lock.unsupported}: training without the one-run lock", file=stream)
                if lock.taken_over:
                    print(
                        f"took over the training lock of {lock.taken_over}, which no longer runs",
                        file=stream,
                    )
                held.enter_context(_tidied_on_failure(created, lock.path))
            return _train_locked(
                run, workdir, stream, progress, on_step, plot, override_config, accept_changed_data
            )
    except BaseException:
        if owned:  # the lock is released now: an empty workdir this run made goes too
            created.tidy_workdir()
        raise


@contextlib.contextmanager
def _tidied_on_failure(created: Created, lock_file: Path):
    """While the lock is held: a run that fails or stops before saving removes the empty
    parts it made (``metrics.jsonl``, ``checkpoints/``). A second Ctrl-C (``train.py``
    exits at once) removes them and the lock file, and its line says what is saved."""
    stop = StopSignals.active()

    def on_exit_now() -> str:
        created.tidy_parts()
        lock_file.unlink(missing_ok=True)  # ours: the kernel drops the flock at exit
        created.tidy_workdir()
        return created.saved_line()

    if stop is not None:  # a library call has none: a second Ctrl-C raises, as any error
        stop.on_exit_now = on_exit_now
    try:
        yield
    except BaseException:
        created.tidy_parts()
        raise
    finally:
        if stop is not None:
            stop.on_exit_now = None


def _train_locked(
    run, workdir, stream, progress, on_step, plot, override_config, accept_changed_data
) -> dict:
    """:func:`train` once the workdir's lock is held."""
    experiment = run.experiment
    t = experiment.train
    ckpt = Checkpointer(
        workdir.resolve(),
        keep=t.keep_checkpoints,
        best_metric=t.best_metric,
        best_mode="min" if t.best_metric in LOWER_IS_BETTER else "max",
    )
    with contextlib.ExitStack() as stack:
        stack.callback(ckpt.close)
        state, start, applied = restore(run, ckpt, run.batch(0), override_config)
        if start:  # the data opened now is the data the checkpoint was trained on
            recorded = load_assets(workdir, start).get("task_origin")
            current = run.source.assets().get("task_origin")
            check_same_data(
                recorded, current, step=start, accept=accept_changed_data, stream=stream
            )
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
        carried = carried_assets(workdir if start else t.init_from)
        loop = _Loop(run, console, log, ckpt, start or None, on_step, carried)
        with StopSignals() as stop:
            state, step, stopped = loop.run_steps(state, start, stop)
            ckpt.wait()
            if stopped:
                console.print(
                    f"{stopped}: saved step {step}; stopping; rerun the same command to resume"
                )
    if plot and is_main():
        from tfmjax.train.plots import plot_metrics

        plot_metrics(workdir)
    result = {"step": step, "stopped": bool(stopped), "eval": loop.last_eval}
    return {**result, "workdir": str(workdir)}
