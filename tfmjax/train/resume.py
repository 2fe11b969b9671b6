"""Resuming into a workdir that already holds a run: which config changes a resume applies,
and the state it starts from (:func:`restore`: the newest good checkpoint, or step 0).

A rerun compares the config saved in the newest checkpoint with the new one:

* changes of the fields in :data:`RESUMABLE` (how long, how often to log / evaluate / save,
  where metrics go) are applied and printed: ``resuming step 1500 with train.steps 1500 -> 3000``;
* a change of ``[mesh]`` is applied and printed too: the state is restored onto the new
  mesh (a mesh missing from an older checkpoint's config is no change);
* a field an older checkpoint's config lacks is no change when it has its default, which
  reproduces what that version did (``train.steps_per_call = 1``, ``train.prefetch``);
* any other change is refused in one line that lists it and names the two ways out: a new
  ``train.workdir``, or ``--override-config`` (``train(..., override_config=True)``), which
  continues with the new settings and records them in the checkpoints and ``metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses

import jax

from tfmjax.checkpoint import Checkpointer, CheckpointError, load_config
from tfmjax.config import SECTIONS, Experiment, changes
from tfmjax.parallel.processes import to_host
from tfmjax.train.run import Run
from tfmjax.train.state import abstract_state, create_state, with_params_from

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
)
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


def check_resume(saved: dict, now: Experiment, step: int, *, override: bool) -> list[str]:
    """The changes to apply and print; raises :class:`CheckpointError` for a refused change
    unless ``override``. ``saved`` is the config of the checkpoint at ``step``."""
    allowed, refused = config_changes(saved, now)
    if refused and not override:
        raise CheckpointError(
            f"{now.workdir} holds a run (step {step}) with a different config: "
            f"{'; '.join(refused)}. Start a new run with train.workdir=NEW_DIR, or continue "
            "this one with the new settings: --override-config"
        )
    return allowed + refused


def restore(run: Run, ckpt: Checkpointer, sample: dict, override: bool):
    """``(state, step, changes)``: the newest good checkpoint (or a fresh state, step 0) and
    the config changes this resume applies (see :func:`check_resume`)."""
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
