"""The warp-specialised pipeline of the Mosaic GPU kernels (:mod:`tfmjax.kernels.mosaic_kernels`):
a memory warpgroup streams tiles from global into shared memory with bulk (TMA) copies through
a ring of ``stages`` slots, each with a ``full`` barrier (the copy landed) and a ``consumed``
barrier (both compute warpgroups are done with it); and the compute warpgroups' turns on the
tensor cores (the forward's ping-pong schedule).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


@dataclasses.dataclass(frozen=True)
class Stream:
    """One streamed tile: ``source(step)`` is its global-memory slice at a step, ``ring`` the
    shared-memory slots, ``full`` (TMA done) and ``consumed`` (both compute warpgroups done)
    one barrier per slot."""

    source: object
    ring: object
    full: object
    consumed: object


def produce(streams, steps, stages: int, max_steps: int):
    """The memory warpgroup: copy every stream's tile of steps ``0 .. steps - 1`` (at most
    ``max_steps``, static) into slot ``step % stages``, waiting for the slot's previous tile
    to be consumed."""

    def issue(step, slot, wait):
        for s in streams:
            if wait:
                plgpu.barrier_wait(s.consumed.at[slot])
            plgpu.copy_gmem_to_smem(s.source(step), s.ring.at[slot], s.full.at[slot])

    for step in range(min(stages, max_steps)):
        pl.when(step < steps)(lambda step=step: issue(step, step, wait=False))

    @pl.loop(stages, steps)
    def _(step):
        issue(step, lax.rem(step, stages), wait=True)

    # Observe the last tiles' consumption too, so every barrier phase is seen before the
    # ring is freed (the interpreter checks it; on a GPU the warpgroup is idle by then).
    @pl.loop(jnp.maximum(steps - stages, 0), steps)
    def _(step):
        for s in streams:
            plgpu.barrier_wait(s.consumed.at[lax.rem(step, stages)])


def slot_of(step, stages: int):
    return lax.rem(step, jnp.asarray(stages, step.dtype))


def wait_full(stream: Stream, slot):
    plgpu.barrier_wait(stream.full.at[slot])
    return stream.ring.at[slot]


def release(stream: Stream, slot):
    plgpu.barrier_arrive(stream.consumed.at[slot])


def take_turns(schedule):
    """One turn of FlashAttention-3's ping-pong schedule (Shah et al. 2024): arrive at the
    two compute warpgroups' ``schedule`` barrier and wait for the other. Warpgroup 1 takes
    one turn before its loop and warpgroup 0 one after, so each issues its matrix multiplies
    while the other runs its softmax; every step takes two turns (after issuing ``S = Q K^T``
    and before ``P V``) in both, whose block ranges are the same."""
    plgpu.barrier_arrive(schedule)
    plgpu.barrier_wait(schedule)
