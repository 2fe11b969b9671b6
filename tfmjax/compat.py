"""What differs between the jax versions tfmjax meets, in one place.

The rest of the library calls jax directly; a difference between versions gets a small
shim here (one section each, in alphabetical order, each naming the versions) and its users
call the shim. ``TESTED_JAX_MINORS`` lists the jax minors the whole suite has passed on; it
and the jax range in ``pyproject.toml`` move together (``tests/test_compat.py`` checks).

Checked against jax 0.11.2 and found the same as on 0.10.2, so no shim: every public jax
name tfmjax, its tests and benchmarks use; ``lax.platform_dependent``; ``pl.pallas_call``,
``BlockSpec`` and both ``CompilerParams``; ``jax.export``; the transfer guards;
``jax.distributed.initialize``; ``jax.core.Tracer``; the private
``jax._src.distributed.global_state.client`` that ``parallel.processes`` reads.
Known and left alone: jax 0.11 deprecates the Pallas Triton backend (each Triton lowering
issues a DeprecationWarning; it still works); leaving it means porting the GPU kernel to
Mosaic GPU, a new kernel rather than a shim.
"""

import jax

# ---- jax version ----------------------------------------------------------------------

JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__)
# Each (major, minor) the whole test suite has passed on. Widen the jax range in
# pyproject.toml (dependencies and the cuda12/cuda13/tpu extras) in the same commit.
TESTED_JAX_MINORS: tuple[tuple[int, int], ...] = ((0, 10),)


def untested_jax(version: tuple[int, ...] = JAX_VERSION) -> str:
    """``""`` on a tested jax minor; else one line saying which minors were tested."""
    if tuple(version[:2]) in TESTED_JAX_MINORS:
        return ""
    tested = ", ".join(f"{major}.{minor}" for major, minor in TESTED_JAX_MINORS)
    shown = ".".join(str(part) for part in version)
    return (
        f"jax {shown} is untested: tfmjax's suite has passed on jax {tested} "
        "(docs/accelerators.md says how to run it on this one)"
    )


# ---- Pallas Triton custom call ----------------------------------------------------------

_TRITON_CUSTOM_CALL_0_10 = "__gpu$xla.gpu.triton"


def triton_custom_call_target() -> str:
    """The custom-call target a Pallas Triton kernel lowers to: ``jax.export`` needs it named
    in ``DisabledSafetyCheck.custom_call`` (it is not on the stable list), and tests find
    kernels by it. jax >= 0.11.0 publishes it as ``pallas.triton.CUSTOM_CALL_TARGET_NAME``
    and keeps the right to change it; jax 0.10 emits the same string without naming it."""
    from jax.experimental.pallas import triton as plgpu

    return getattr(plgpu, "CUSTOM_CALL_TARGET_NAME", _TRITON_CUSTOM_CALL_0_10)
