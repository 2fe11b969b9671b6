"""The mesh that evaluation and generation run a checkpoint on.

By default the checkpoint's own ``[mesh]``, shrunk to the devices present
(:func:`tfmjax.parallel.mesh.fit_mesh`: a run trained on ``data=2 x fsdp=2 x tensor=2``
evaluates on one device on a one-device machine). ``mesh.*`` overrides (``mesh.fsdp=-1``,
as ``train.py`` takes them) apply on top of the checkpoint's ``[mesh]`` and are used as
given, checked in one line. The batch size of training is not checked: evaluation and
decoding batches need not split evenly over the batch axes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax

from tfmjax.config import ConfigError, Experiment, apply_overrides, from_dict
from tfmjax.parallel.mesh import check_model_fits, device_mesh, fit_mesh, mesh_shape, mesh_text
from tfmjax.parallel.placement import Placement
from tfmjax.parallel.rules import rules_for


def mesh_overrides(overrides: Sequence[str], experiment: Experiment) -> Experiment:
    """``experiment`` with ``mesh.*`` overrides applied to its ``[mesh]``; any other
    override is refused in one line (the rest of the config is the checkpoint's)."""
    for item in overrides:
        if not item.strip().startswith("mesh."):
            raise ConfigError(
                f"override {item!r}: only mesh.* settings (mesh.data, mesh.fsdp, mesh.expert, "
                "mesh.tensor, mesh.rules) apply here; the rest of the config comes from the "
                "checkpoint"
            )
    raw = apply_overrides({"mesh": dataclasses.asdict(experiment.mesh)}, overrides)
    return dataclasses.replace(experiment, mesh=from_dict(raw).mesh)


def inference_placement(
    experiment: Experiment, overrides: Sequence[str] = (), devices=None
) -> tuple[Placement, str | None]:
    """``(placement, line)``: where a checkpoint of ``experiment`` (its saved config) is
    evaluated or sampled, and one line naming that mesh when it is not the checkpoint's own
    (None when it is). ``overrides``: ``mesh.*=value`` strings. ``devices``: default all of
    ``jax.devices()`` (every process's). ConfigError (one line) for a mesh that cannot work."""
    devices = list(jax.devices() if devices is None else devices)
    saved, n = experiment.mesh, len(devices)
    several = jax.process_count() > 1
    if overrides:
        experiment = mesh_overrides(overrides, experiment)
        shape = mesh_shape(experiment.mesh, n)
        why = "as the mesh.* settings given ask"
    else:
        shape = fit_mesh(saved, n, every_device=several)
        kind = devices[0].platform if devices else "no"
        why = f"fitted to the {n} {kind} device{'s' * (n != 1)} here"
    check_model_fits(experiment, shape)
    cfg = experiment.mesh
    rules = rules_for(cfg.rules, experiment.model, shape)
    placement = Placement(device_mesh(shape, devices), rules)
    try:
        same = mesh_shape(saved, n) == shape and saved.rules == cfg.rules
    except ConfigError:  # the checkpoint's mesh does not fit these devices
        same = False
    if same:
        return placement, None
    trained = mesh_text({axis: getattr(saved, axis) for axis in shape})
    named = f" ({cfg.rules} rules)" if saved.rules != cfg.rules else ""
    line = f"mesh {mesh_text(shape)}{named}, not the checkpoint's {trained}: {why}"
    return placement, line
