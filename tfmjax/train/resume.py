"""Resuming into a workdir that already holds a run: which config changes a resume applies,
and the state it starts from (:func:`restore`: the newest good checkpoint, or step 0).

A rerun compares the config saved in the newest checkpoint with the new one:

* changes of the fields in :data:`RESUMABLE` (how long, how often to log / evaluate / save,
  where metrics go) are applied and printed: ``resuming step 1500 with train.steps 1500 -> 3000``;
* a change of ``[mesh]`` is applied and printed too: the state is restored onto the new
  mesh (a mesh missing from an older checkpoint's config is no change);
* a field an older checkpoint's config lacks is no change when it has its default, which
  reproduces what that version did (``train.steps_per_call``: ``auto``, 1 a call on a CPU and
  the same bits anywhere; ``train.prefetch``);
* any other change is refused in one line that lists it and names the two ways out: a new
  ``train.workdir``, or ``--override-config`` (``train(..., override_config=True)``), which
  continues with the new settings and records them in the checkpoints and ``metrics.jsonl``;
  when the checkpoint's arrays do not fit the new model (another family, width, depth...),
  only the new workdir is offered;
* a change of what a decaying schedule spans (``train.steps``, ``optim.schedule_steps``) is
  applied only if the learning rate at the resumed step stays what it was (a wsd run in its
  stable phase, a constant or inverse-sqrt schedule, ``optim.schedule_steps`` kept): a
  cosine run trained longer would jump back up its curve. Otherwise it is refused in one
  line naming both rates and the choice: keep the schedule (``optim.schedule_steps`` = the
  old span; past it the rate stays at ``optim.end_learning_rate``) or stretch it
  (``--override-config``, and the printed change names the jump).
"""

from __future__ import annotations

import dataclasses
import math

import jax

from tfmjax.checkpoint import Checkpointer, CheckpointError, load_config
from tfmjax.checkpoint.errors import CorruptStep
from tfmjax.config import SECTIONS, Experiment, changes, from_dict
from tfmjax.parallel.processes import to_host
from tfmjax.train.run import Run, make_run_schedule, schedule_span
from tfmjax.train.state import (
    abstract_state,
    create_state,
    from_saved,
    saved_optimizer,
    state_shardings,
    with_params_from,
)

# Fields a resume may change: they decide how long the run goes and what it writes, not what
# a training step computes (train.steps also stretches a decaying learning-rate schedule).
RESUMABLE = (
    "train.steps",
    "train.log_every",
    "train.eval_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.tensorboard",
    "train.steps_per_call",  # the same steps, run K to a call: the same bits
    "train.prefetch",  # when batches are built, not what they hold
    "data.eval_examples",
    "model.moe_eval_capacity_factor",  # evaluation and decoding only: no trained value moves
)
# What a decaying learning-rate schedule spans: a change moves the rate of a resumed step
SPAN = ("train.steps", "optim.schedule_steps")
# Not part of the run's identity: the name comes from the config file, the workdir is where
# the checkpoint was found, init_from only seeds step 0.
IGNORED = ("train.workdir", "train.init_from")


def config_changes(saved: dict, now: Experiment) -> tuple[list[str], list[str]]:
    """``(allowed, refused)``: ``key old -> new`` texts of the changes from ``saved`` to ``now``."""
    allowed, refused = [], []
    for key, old, new in changes(saved, now):
        if key in IGNORED or (key.startswith("mesh.") and "mesh" not in saved):
            continue
        if _is_new_default(key, saved, new):
            continue
        ok = key in RESUMABLE or key.startswith("mesh.")
        (allowed if ok else refused).append(f"{key} {old!r} -> {new!r}")
    return allowed, refused


def _is_new_default(key: str, saved: dict, value) -> bool:
    """Whether ``key`` (``section.field``) is a field ``saved`` (an older version's config)
    does not have, at its default value now."""
    section, _, name = key.partition(".")
    if section not in SECTIONS or name in saved.get(section, {}):
        return False
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    field = fields.get(name)
    if field is None or field.default is dataclasses.MISSING:
        return False
    return value == field.default


def learning_rate(experiment: Experiment, step: int) -> float:
    """The learning rate ``experiment``'s schedule gives step ``step``."""
    return float(make_run_schedule(experiment)(step))


def _with_span(experiment: Experiment, steps: int, schedule_steps: int) -> Experiment:
    optim = dataclasses.replace(experiment.optim, schedule_steps=schedule_steps)
    train = dataclasses.replace(experiment.train, steps=steps)
    return dataclasses.replace(experiment, optim=optim, train=train)


def _same_rate(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _span_check(saved: dict, now: Experiment, step: int, spanned: list[str]):
    """``(same, note, refusal)`` for a change of what the schedule spans: the saved run's
    learning rate at ``step`` against the one the new span gives it (all else as saved)."""
    before = from_dict(saved)
    after = _with_span(before, now.train.steps, now.optim.schedule_steps)
    old, new = learning_rate(before, step), learning_rate(after, step)
    if _same_rate(old, new):
        return True, "", ""
    name, end = before.optim.schedule, before.optim.end_learning_rate
    span_old, span_new = schedule_span(before), schedule_span(after)
    note = f"the {name} learning rate at step {step}: {old:.3g} -> {new:.3g}"
    refusal = (
        f"{now.workdir} holds a run at step {step} and {', '.join(spanned)} would move its "
        f"{name} learning rate there from {old:.3g} to {new:.3g} (the schedule would span "
        f"{span_new} steps, not {span_old}). Keep the schedule as it was (then "
        f"optim.end_learning_rate={end:g}): add optim.schedule_steps={span_old}; or take the "
        "new span: --override-config"
    )
    return False, note, refusal


def check_resume(
    saved: dict, now: Experiment, step: int, *, override: bool, fits: bool = True
) -> list[str]:
    """The changes to apply and print; raises :class:`CheckpointError` for a refused change
    unless ``override``. ``saved`` is the config of the checkpoint at ``step``. A change of
    what the schedule spans (:data:`SPAN`) is allowed when it leaves the learning rate at
    ``step`` as it was; otherwise it is refused on its own line (see the module's text), or,
    under ``override``, applied with the two rates named. ``fits``: whether the checkpoint's
    arrays fit the state of ``now`` (when not, only a new run is offered)."""
    allowed, refused = config_changes(saved, now)
    spanned = [c for c in allowed + refused if c.split(" ", 1)[0] in SPAN]
    if spanned:
        same, note, refusal = _span_check(saved, now, step, spanned)
        others = [c for c in refused if c not in spanned]
        if same:
            allowed, refused = [c for c in spanned if c not in allowed] + allowed, others
        elif override:  # the note goes on train.steps when it changed
            named = next((c for c in spanned if c.startswith("train.steps ")), spanned[0])
            allowed = [f"{c} ({note})" if c == named else c for c in allowed]
            refused = [f"{c} ({note})" if c == named else c for c in refused]
        elif not others:
            raise CheckpointError(refusal)
    if refused and not override:
        ways = (
            "Start a new run with train.workdir=NEW_DIR, or continue this one with the new "
            "settings: --override-config"
            if fits
            else "Its parameters do not fit this model, so start a new run: train.workdir=NEW_DIR"
        )
        raise CheckpointError(
            f"{now.workdir} holds a run (step {step}) with a different config: "
            f"{'; '.join(refused)}. {ways}"
        )
    return allowed + refused


def restore(run: Run, ckpt: Checkpointer, sample: dict, override: bool):
    """``(state, step, changes)``: the newest good checkpoint (or a fresh state, step 0) and
    the config changes this resume applies (see :func:`check_resume`)."""
    exp = run.experiment
    saved_tx = saved_optimizer(run.tx)  # checkpoints hold its layout
    shardings = run.state_shardings
    if saved_tx is not run.tx:  # one device: the fused optimizer's state is laid out apart
        shardings = state_shardings(run.model, saved_tx, sample, exp.train.seed, run.placement)
    target = abstract_state(run.model, saved_tx, sample, exp.train.seed, shardings)
    latest = ckpt.latest_step()
    if latest is None:
        state = create_state(run.model, run.tx, sample, exp.train.seed, run.state_shardings)
        if exp.train.init_from:
            state, _ = with_params_from(state, exp.train.init_from, run.tx)
            # via the host: the loaded params sit on one device, the mesh may span processes
            state = jax.device_put(to_host(state), run.state_shardings)
        return state, 0, []
    saved = load_config(ckpt.directory)
    try:
        fits = not ckpt.misfit(target, latest)
    except CorruptStep:  # the restore below falls back to an older step, and says so
        fits = True
    applied = check_resume(saved, exp, latest, override=override, fits=fits)
    state, step = ckpt.restore(target, config=None if override else _as_checked(saved, exp))
    if saved_tx is not run.tx:
        state = jax.device_put(from_saved(state, run.tx), run.state_shardings)
    return state, step, applied


def _as_checked(saved: dict, now: Experiment) -> dict:
    """``now`` as a dict whose model section :meth:`Checkpointer.restore` may compare with the
    checkpoint's: what :func:`check_resume` let through is made as saved (a model field the
    saved config lacks, at its default now; a resumable model field such as the evaluation
    capacity), so that the restore refuses only what that check did not see (another step's
    config)."""
    out = now.to_dict()
    model = {}
    for name, value in out["model"].items():
        key = f"model.{name}"
        if _is_new_default(key, saved, value):
            continue
        model[name] = saved["model"].get(name, value) if key in RESUMABLE else value
    return {**out, "model": model}


def longer_hint(experiment: Experiment, step: int) -> str:
    """How to train a run that finished at ``step`` twice as long: ``train.steps``, and
    when that would move the learning rate of ``step``, the schedule's two choices."""
    steps = 2 * step
    longer = _with_span(experiment, steps, experiment.optim.schedule_steps)
    old, new = learning_rate(experiment, step), learning_rate(longer, step)
    hint = f"to train longer, rerun with train.steps={steps}"
    if _same_rate(old, new):
        return hint
    name, span = experiment.optim.schedule, schedule_span(experiment)
    return (
        f"{hint} and either optim.schedule_steps={span} (keeps the {name} schedule: the rate "
        f"stays at {old:.3g}) or --override-config (stretches it to {steps} steps: the rate at "
        f"step {step} goes from {old:.3g} to {new:.3g})"
    )
