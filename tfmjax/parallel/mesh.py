"""The device mesh of a run: ``data x fsdp x expert x tensor`` from the ``[mesh]`` config, checked
against the devices and the model in one line each.

Every run has a mesh; the default ``(1, 1, 1)`` is one device. Axes are ``AxisType.Auto``:
GSPMD propagates shardings from the params' and the batch's layouts and the logical
constraints in the layers.
"""

from __future__ import annotations

import math

import jax
from jax.sharding import AxisType, Mesh

from tfmjax.config import MESH_AXES, ConfigError, Experiment, MeshConfig


def mesh_text(shape) -> str:
    """``data=2 x fsdp=2 x tensor=2`` for a mesh's (or config's) axis sizes; ``expert`` is
    named only when it is not 1 (``data=2 x fsdp=1 x expert=2 x tensor=1``)."""
    sizes = {axis: size for axis, size in dict(shape).items() if axis != "expert" or size != 1}
    return " x ".join(f"{axis}={size}" for axis, size in sizes.items())


def mesh_shape(cfg: MeshConfig, num_devices: int) -> dict[str, int]:
    """``{"data": d, "fsdp": f, "expert": e, "tensor": t}`` with a ``-1`` filled in;
    ConfigError (one line) if the sizes do not divide ``num_devices``."""
    sizes = {axis: getattr(cfg, axis) for axis in MESH_AXES}
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if num_devices % fixed:
        raise ConfigError(
            f"mesh {mesh_text(sizes)} needs a multiple of {fixed} devices, and there are "
            f"{num_devices}; choose sizes whose product divides {num_devices}, or set one "
            "of them to -1"
        )
    return {axis: num_devices // fixed if size == -1 else size for axis, size in sizes.items()}


def check_model_fits(experiment: Experiment, shape: dict[str, int]) -> None:
    """ConfigError (one line) if ``mesh.tensor`` does not split the heads or the FFN width,
    or ``mesh.expert`` the experts of a mixture."""
    m, tensor, expert = experiment.model, shape["tensor"], shape["expert"]
    if experiment.mesh.rules == "replicated":  # replicated rules split no model axis
        return
    if m.moe_experts and m.moe_experts % expert:
        raise ConfigError(
            f"mesh.expert={expert} does not divide model.moe_experts={m.moe_experts}: expert "
            f"parallelism splits the experts evenly; pick an expert size that divides "
            f"{m.moe_experts}"
        )
    for field, size in (("num_heads", m.num_heads), ("d_ff", m.d_ff)):
        if size % tensor:
            raise ConfigError(
                f"mesh.tensor={tensor} does not divide model.{field}={size}: tensor "
                f"parallelism splits it evenly; pick a tensor size that divides {size}"
            )


def check_fits(experiment: Experiment, shape: dict[str, int]) -> None:
    """ConfigError (one line) if the batch or the model does not split over ``shape``."""
    check_model_fits(experiment, shape)
    d, o = experiment.data, experiment.optim
    tensor, replicated = shape["tensor"], experiment.mesh.rules == "replicated"
    ways = shape["data"] * shape["fsdp"] * shape["expert"] * (tensor if replicated else 1)
    rows = d.batch_size // o.grad_accum_steps
    if rows % ways:
        raise ConfigError(
            f"data.batch_size={d.batch_size} (micro-batches of {rows} rows) does not split over "
            f"the {ways} batch shards of mesh {mesh_text(shape)}; use a multiple of {ways} rows"
        )


def fit_mesh(cfg: MeshConfig, num_devices: int, every_device: bool = False) -> dict[str, int]:
    """The mesh sizes of ``cfg`` shrunk to ``num_devices``: ``data`` first, then ``expert``,
    ``tensor``, ``fsdp`` last (it is what lets a big model fit), each axis to its largest
    divisor whose product with the others divides ``num_devices`` (e.g. ``2 x 2 x 2`` on 4
    devices is ``1 x 2 x 2``, on 1 device ``1 x 1 x 1``). ``every_device`` (several processes: all
    devices must take part): ``data`` then grows to take the devices left over. A ``-1``
    still takes the rest. Sizes that already fit are kept."""
    sizes = {axis: getattr(cfg, axis) for axis in MESH_AXES}
    for axis in ("data", "expert", "tensor", "fsdp"):
        fixed = math.prod(size for size in sizes.values() if size != -1)
        if num_devices % fixed == 0:
            break
        if sizes[axis] != -1:
            others = fixed // sizes[axis]
            fits = [d for d in range(1, sizes[axis] + 1) if sizes[axis] % d == 0]
            sizes[axis] = max(d for d in fits if num_devices % (others * d) == 0 or d == 1)
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if every_device and -1 not in sizes.values() and fixed < num_devices:
        sizes["data"] *= num_devices // fixed
    return mesh_shape(MeshConfig(**sizes, rules=cfg.rules), num_devices)


def make_mesh(experiment: Experiment, devices=None) -> Mesh:
    """The run's mesh over the first ``data x fsdp x expert x tensor`` of ``devices`` (default: all
    of ``jax.devices()``, every process's); checked with :func:`check_fits`."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(experiment.mesh, len(devices))
    check_fits(experiment, shape)
    return device_mesh(shape, devices)


def device_mesh(shape: dict[str, int], devices) -> Mesh:
    """The mesh of axis sizes ``shape`` over the first of ``devices``; with several
    processes every device must take part (ConfigError, one line, otherwise)."""
    devices = list(devices)
    n = math.prod(shape.values())
    if n < len(devices) and jax.process_count() > 1:
        raise ConfigError(
            f"mesh uses {n} of {len(devices)} devices, and with {jax.process_count()} "
            "processes every device must take part; set one mesh axis to -1"
        )
    return jax.make_mesh(
        tuple(shape.values()),
        MESH_AXES,
        axis_types=(AxisType.Auto,) * len(MESH_AXES),
        devices=devices[:n],
    )
