"""Decoding strategies: frozen dataclasses. The jitted loop takes a strategy split in two
(:func:`split_traced`): its kind, ``TopK.k`` and ``BeamSearch.beam_size`` are static (one
compile each); its float fields (temperature, top-p ``p``, beam ``alpha``) are traced float32
scalars, so a new temperature reuses the compiled program.

Sampling strategies pick one token per row from ``logits [B,V]`` with ``sample(logits, rng)``:

* :class:`Greedy`: ``argmax_i p_i``.
* :class:`Temperature`: ``i ~ softmax(logits / τ)``.
* :class:`TopK`: sample among the ``k`` largest logits, renormalised, at temperature ``τ``.
* :class:`TopP` (nucleus, Holtzman et al. 2020): the smallest set of most likely tokens
  whose probability under
  ``softmax(logits / τ)`` reaches ``p`` (temperature first, as Hugging Face does), renormalised.

:class:`BeamSearch` keeps ``beam_size`` hypotheses and ranks finished ones by the GNMT score
``log P(y) / lp(|y|)``, ``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al. 2016); see
:mod:`tfmjax.decode.beam`.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


def _check_temperature(name: str, temperature) -> None:
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(
            f"{name}(temperature={temperature!r}) is invalid: must be a finite "
            "number > 0 (use Greedy() for the temperature -> 0 limit)"
        )


def _check_int(name: str, field: str, value, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}({field}={value!r}) is invalid: must be an int >= {lo}")


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Always the most likely token (ties: the lowest id)."""

    def sample(self, logits, rng=None):
        del rng
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Temperature:
    """Ancestral sampling from ``softmax(logits / temperature)``."""

    temperature: float = 1.0

    def __post_init__(self):
        _check_temperature("Temperature", self.temperature)

    def sample(self, logits, rng):
        return jax.random.categorical(rng, logits / self.temperature, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class TopK:
    """Sample among the ``k`` most likely tokens (exactly ``k``: ties broken by lowest id)."""

    k: int
    temperature: float = 1.0

    def __post_init__(self):
        _check_int("TopK", "k", self.k, 1)
        _check_temperature("TopK", self.temperature)

    def sample(self, logits, rng):
        values, ids = jax.lax.top_k(logits, self.k)  # [B,k] descending
        choice = jax.random.categorical(rng, values / self.temperature, axis=-1)
        return jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


def nucleus_mask(logits, p: float, temperature: float = 1.0):
    """``[B,V]`` bool: the top-p nucleus of ``softmax(logits / temperature)`` per row.

    A token is kept when the probability of the tokens strictly more likely than it (sorted,
    ties by lowest id) is below ``p``, so the most likely token is always kept.
    """
    scaled = logits / temperature
    order = jnp.argsort(-scaled, axis=-1, stable=True)
    probs = jax.nn.softmax(jnp.take_along_axis(scaled, order, axis=-1), axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = before < p
    rows = jnp.arange(logits.shape[0])[:, None]
    return jnp.zeros(logits.shape, bool).at[rows, order].set(keep_sorted)


@dataclasses.dataclass(frozen=True)
class TopP:
    """Nucleus sampling: the smallest most-likely set with probability >= ``p``."""

    p: float
    temperature: float = 1.0

    def __post_init__(self):
        if (
            isinstance(self.p, bool)
            or not isinstance(self.p, (int, float))
            or not 0.0 < self.p <= 1.0
        ):
            raise ValueError(f"TopP(p={self.p!r}) is invalid: must be a number in (0, 1]")
        _check_temperature("TopP", self.temperature)

    def sample(self, logits, rng):
        keep = nucleus_mask(logits, self.p, self.temperature)
        masked = jnp.where(keep, logits / self.temperature, -jnp.inf)
        return jax.random.categorical(rng, masked, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class BeamSearch:
    """Beam search with ``beam_size`` hypotheses and GNMT length penalty ``alpha`` (>= 0)."""

    beam_size: int = 4
    alpha: float = 0.6

    def __post_init__(self):
        _check_int("BeamSearch", "beam_size", self.beam_size, 1)
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, (int, float))
            or not math.isfinite(self.alpha)
            or self.alpha < 0
        ):
            raise ValueError(
                f"BeamSearch(alpha={self.alpha!r}) is invalid: must be a finite "
                "number >= 0 (0 = no length penalty)"
            )

    def length_penalty(self, length):
        """GNMT ``((5 + length) / 6) ** alpha``. ``alpha`` may be traced: the powers XLA
        rewrites for a constant exponent (2: a product, 0.5: a square root) are taken the
        same way, so a traced alpha gives the bits a constant one does."""
        base = (5.0 + jnp.asarray(length, jnp.float32)) / 6.0
        alpha = self.alpha
        if isinstance(alpha, (int, float)):
            return base**alpha
        return jnp.where(
            alpha == 2, base * base, jnp.where(alpha == 0.5, jnp.sqrt(base), base**alpha)
        )


SAMPLERS = (Greedy, Temperature, TopK, TopP)
STRATEGIES = SAMPLERS + (BeamSearch,)

# The float fields the jitted loop traces, and the value each takes in the static part.
_TRACED = {"temperature": 1.0, "p": 1.0, "alpha": 0.0}


def split_traced(strategy):
    """``(static, values)``: ``strategy`` with its float fields (temperature, ``p``, ``alpha``)
    set to fixed values, a hashable jit key (kind, ``k``, ``beam_size``), and those fields as
    float32 scalars ``{name: []}`` to pass traced. :func:`bind_traced` joins them again."""
    names = [f.name for f in dataclasses.fields(strategy) if f.name in _TRACED]
    values = {name: np.float32(getattr(strategy, name)) for name in names}
    return dataclasses.replace(strategy, **{name: _TRACED[name] for name in names}), values


def bind_traced(static, values: dict):
    """Inside the trace: ``static`` with its float fields set to the traced ``values``
    (copied without ``__post_init__``, whose checks are for Python numbers)."""
    bound = copy.copy(static)
    for name, value in values.items():
        object.__setattr__(bound, name, value)
    return bound
