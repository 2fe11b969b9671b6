"""Learning-rate schedules as Optax schedules (step -> lr).

Every schedule here is a pure ``jnp`` function of the step: it is jit-safe,
accepts Python ints or int32 step arrays (the ``count`` Optax keeps), and
returns a float32 scalar (or an array shaped like ``step``).

Warmup convention shared by all ``warmup_*`` schedules: the rate rises
linearly from 0 at step 0 to ``peak_lr`` at step ``warmup_steps``;
``warmup_steps=0`` means ``peak_lr`` from step 0. Past ``total_steps`` a
decaying schedule stays at ``end_lr``.

``peak_lr`` and ``warmup_steps`` may also be traced arrays (unchecked: they come from
checked configs), one per run when :mod:`tfmjax.train.stacked` vmaps the step over runs
with their own rates and warmups; the Python numbers of a plain run take the same code
they always did (the branches on ``warmup_steps == 0`` in Python).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import optax

from tfmjax.config import SCHEDULES

__all__ = [
    "SCHEDULE_NAMES",
    "inverse_sqrt_warmup",
    "make_schedule",
    "warmup_constant",
    "warmup_cosine",
    "warmup_linear",
    "warmup_stable_decay",
]

# The names a config may give (``optim.schedule``); make_schedule builds each of them.
SCHEDULE_NAMES: tuple[str, ...] = SCHEDULES


# --------------------------------------------------------------------------- checks


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, jax.Array):  # a traced per-run value (tfmjax.train.stacked)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_float(name: str, value, minimum: float = 0.0) -> float:
    if isinstance(value, jax.Array):  # a traced per-run value (tfmjax.train.stacked)
        return value
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    return float(value)


def _check_total(total_steps, warmup_steps: int) -> int:
    total_steps = _check_int("total_steps", total_steps, 0)
    if not isinstance(warmup_steps, jax.Array) and total_steps < warmup_steps:
        raise ValueError(f"total_steps must be >= warmup_steps={warmup_steps}, got {total_steps!r}")
    return total_steps


# --------------------------------------------------------------------------- helpers


def _as_float(step) -> jnp.ndarray:
    return jnp.asarray(step, jnp.float32)


def _warmup_factor(step: jnp.ndarray, warmup_steps: int) -> jnp.ndarray:
    """Linear 0 -> 1 over [0, warmup_steps], 1 after; 1 everywhere if warmup_steps == 0."""
    if isinstance(warmup_steps, jax.Array):
        ramp = jnp.clip(step / jnp.maximum(warmup_steps, 1), 0.0, 1.0)
        return jnp.where(warmup_steps == 0, jnp.ones_like(step), ramp)
    if warmup_steps == 0:
        return jnp.ones_like(step)
    return jnp.clip(step / warmup_steps, 0.0, 1.0)


def _decay_progress(step: jnp.ndarray, start: int, end: int) -> jnp.ndarray:
    """Fraction in [0, 1] of the decay window [start, end] covered at ``step``.

    An empty window (start == end) is 0 up to ``start`` and 1 after it.
    """
    if isinstance(start, jax.Array):
        empty = jnp.where(step > start, 1.0, 0.0).astype(jnp.float32)
        ramp = jnp.clip((step - start) / jnp.maximum(end - start, 1), 0.0, 1.0)
        return jnp.where(end == start, empty, ramp)
    if end == start:
        return jnp.where(step > start, 1.0, 0.0).astype(jnp.float32)
    return jnp.clip((step - start) / (end - start), 0.0, 1.0)


# --------------------------------------------------------------------------- schedules


def inverse_sqrt_warmup(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """Vaswani et al. (2017): ``lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.

    The formula at step 0 is ``min(inf, 0) = 0``. To get exactly 0.0 with no
    inf/NaN anywhere (also not in gradients of the schedule), the rsqrt branch
    uses ``max(step, 1)`` while the linear branch uses the true step, so the
    min is 0 at step 0 and the formula unchanged for step >= 1. The peak,
    ``scale * (d_model * warmup_steps)^-0.5``, is reached at step == warmup_steps.
    """
    d_model = _check_int("d_model", d_model, 1)
    warmup_steps = _check_int("warmup_steps", warmup_steps, 1)
    scale = _check_float("scale", scale)
    base = scale * d_model**-0.5
    slope = warmup_steps**-1.5

    def schedule(step):
        step = _as_float(step)
        decay = jnp.reciprocal(jnp.sqrt(jnp.maximum(step, 1.0)))
        return base * jnp.minimum(decay, step * slope)

    return schedule


def warmup_cosine(
    peak_lr: float, warmup_steps: int, total_steps: int, end_lr: float = 0.0
) -> optax.Schedule:
    """Linear warmup to ``peak_lr``, then half-cosine to ``end_lr`` at ``total_steps``."""
    peak_lr = _check_float("peak_lr", peak_lr)
    end_lr = _check_float("end_lr", end_lr)
    warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
    total_steps = _check_total(total_steps, warmup_steps)

    def schedule(step):
        step = _as_float(step)
        p = _decay_progress(step, warmup_steps, total_steps)
        decayed = end_lr + (peak_lr - end_lr) * 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        return jnp.where(step < warmup_steps, peak_lr * _warmup_factor(step, warmup_steps), decayed)

    return schedule


def warmup_linear(
    peak_lr: float, warmup_steps: int, total_steps: int, end_lr: float = 0.0
) -> optax.Schedule:
    """Linear warmup to ``peak_lr``, then linear decay to ``end_lr`` at ``total_steps``."""
    peak_lr = _check_float("peak_lr", peak_lr)
    end_lr = _check_float("end_lr", end_lr)
    warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
    total_steps = _check_total(total_steps, warmup_steps)

    def schedule(step):
        step = _as_float(step)
        p = _decay_progress(step, warmup_steps, total_steps)
        decayed = peak_lr + (end_lr - peak_lr) * p
        return jnp.where(step < warmup_steps, peak_lr * _warmup_factor(step, warmup_steps), decayed)

    return schedule


def warmup_constant(peak_lr: float, warmup_steps: int) -> optax.Schedule:
    """Linear warmup to ``peak_lr``, then constant forever."""
    peak_lr = _check_float("peak_lr", peak_lr)
    warmup_steps = _check_int("warmup_steps", warmup_steps, 0)

    def schedule(step):
        return peak_lr * _warmup_factor(_as_float(step), warmup_steps)

    return schedule


def warmup_stable_decay(
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    decay_fraction: float = 0.1,
    end_lr: float = 0.0,
) -> optax.Schedule:
    """Warmup-stable-decay: linear warmup, constant ``peak_lr``, linear decay to ``end_lr``.

    The decay covers the last ``round(decay_fraction * total_steps)`` steps,
    i.e. it starts at ``decay_start = total_steps - that`` and ends at
    ``total_steps``; ``decay_start`` must not precede the end of warmup.
    """
    peak_lr = _check_float("peak_lr", peak_lr)
    end_lr = _check_float("end_lr", end_lr)
    warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
    total_steps = _check_total(total_steps, warmup_steps)
    decay_fraction = _check_float("decay_fraction", decay_fraction)
    if decay_fraction > 1.0:
        raise ValueError(f"decay_fraction must be in [0, 1], got {decay_fraction!r}")
    decay_start = total_steps - round(decay_fraction * total_steps)
    if not isinstance(warmup_steps, jax.Array) and decay_start < warmup_steps:
        raise ValueError(
            f"decay_fraction={decay_fraction!r} makes the decay start at step {decay_start}, "
            f"before warmup_steps={warmup_steps} ends; valid: decay_fraction <= "
            f"{(total_steps - warmup_steps) / max(total_steps, 1):.4g}"
        )

    def schedule(step):
        step = _as_float(step)
        p = _decay_progress(step, decay_start, total_steps)
        decayed = peak_lr + (end_lr - peak_lr) * p
        return jnp.where(step < warmup_steps, peak_lr * _warmup_factor(step, warmup_steps), decayed)

    return schedule


def make_schedule(
    name: str,
    *,
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    d_model: int,
    end_lr: float = 0.0,
    decay_fraction: float = 0.1,
) -> optax.Schedule:
    """Build the schedule called ``name`` (one of ``SCHEDULE_NAMES``).

    For ``"inverse_sqrt"``, ``peak_lr`` is the ``scale`` multiplier of the
    Vaswani formula (not the peak itself: the peak is
    ``peak_lr * (d_model * warmup_steps)^-0.5``); ``total_steps`` and
    ``end_lr`` are ignored. Arguments a schedule does not use are not checked.
    """
    builders = {
        "inverse_sqrt": lambda: inverse_sqrt_warmup(d_model, warmup_steps, scale=peak_lr),
        "cosine": lambda: warmup_cosine(peak_lr, warmup_steps, total_steps, end_lr=end_lr),
        "linear": lambda: warmup_linear(peak_lr, warmup_steps, total_steps, end_lr=end_lr),
        "constant": lambda: warmup_constant(peak_lr, warmup_steps),
        "wsd": lambda: warmup_stable_decay(
            peak_lr, warmup_steps, total_steps, decay_fraction=decay_fraction, end_lr=end_lr
        ),
    }
    if name not in builders:
        raise ValueError(f"name must be one of {SCHEDULE_NAMES}, got {name!r}")
    return builders[name]()
