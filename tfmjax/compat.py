"""What differs between the jax versions tfmjax meets, in one place.

The rest of the library calls jax directly; a difference between versions gets a small
shim here (one section each, in alphabetical order, each naming the versions) and its users
call the shim. ``TESTED_JAX_MINORS`` lists the jax minors the whole suite has passed on; it
and the jax range in ``pyproject.toml`` move together (``tests/test_compat.py`` checks).

Checked against jax 0.11.2 and found the same as on 0.10.2, so no shim: every public jax
name tfmjax, its tests and benchmarks use; ``lax.platform_dependent``; ``pl.pallas_call``,
``BlockSpec`` and both ``CompilerParams``; ``jax.export``; the transfer guards;
``jax.distributed.initialize``; ``jax.core.Tracer``; the private
``jax._src.distributed.global_state.client`` that ``parallel.processes`` reads. One
difference found since (on an H200's host, lowering from its CPU): see
:func:`gpu_lowering_target`.
jax 0.11 deprecates the Pallas Triton backend: see :data:`PALLAS_TRITON_DEPRECATION`.

The few places tfmjax leans on jax internals are here too (nothing else imports
``jax._src``): :func:`cudnn_dot_product_attention` below, whose comment says which versions
it was written against and what would let it go.
"""

import contextlib
import threading

import jax
import jax.numpy as jnp

# ---- cuDNN attention --------------------------------------------------------------------
#
# ``jax.nn.dot_product_attention(..., implementation="cudnn")`` that can also be traced on a
# host without CUDA (jax 0.10.2; unchanged in jax's source at 0.11.1). The public function
# asks the local jaxlib for its cuDNN version at trace time
# (``jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version``) and raises
# ``RuntimeError("cuDNN is not detected.")`` where the CUDA plugin is not installed, although
# nothing else in tracing or in lowering for ``cuda`` needs a GPU. On such a host (only there)
# the query answers NOMINAL_CUDNN_VERSION while the call is traced, so a CPU machine can lower
# or ``jax.export`` cuDNN attention for ``cuda``. Goes when jax stops querying the local cuDNN
# at trace time.
#
# And odd lengths (same versions): the public function hands its custom VJP a placeholder bias
# (``jnp.zeros(0)``) when there is none, so the check meant for a real bias
# (``NotImplementedError: Unsupported sequence length`` unless T and S are even) applies to
# every call that is differentiated. An odd T or S is padded by one slot here, masked by the
# per-row lengths, and the padded query row is dropped. Goes when jax checks the real bias only.

# The cuDNN version assumed while tracing on a host without CUDA (9.8.0). jax uses the
# version only to refuse shapes that need a newer cuDNN: MLA-style head widths (< 9.10) and
# compute capability 10.3 (< 9.11; never the case on a host without a GPU); the GPU host's
# XLA checks the real library when it compiles the program.
NOMINAL_CUDNN_VERSION = 90800

_LOCK = threading.Lock()


def cuda_plugin_present() -> bool:
    """Whether this jaxlib can talk to CUDA (the ``jax[cuda12|cuda13]`` plugin is installed)."""
    from jax._src.lib import cuda_versions

    return cuda_versions is not None


def cuda_runtime_version() -> int | None:
    """The CUDA runtime version jax's CUDA plugin reports (e.g. 12090 for 12.9.0); None
    without the plugin (a CPU host). jax's own Mosaic GPU attention reads it the same way
    to refuse the runtimes whose ptxas miscompiles its causal mask."""
    from jax._src.lib import cuda_versions

    return None if cuda_versions is None else int(cuda_versions.cuda_runtime_get_version())


@contextlib.contextmanager
def _nominal_cudnn_version():
    """While open, jax's cuDNN attention reads :data:`NOMINAL_CUDNN_VERSION` as the local
    cuDNN version (only on a host without the CUDA plugin; a no-op elsewhere)."""
    if cuda_plugin_present():
        yield
        return
    from jax._src.cudnn import fused_attention_stablehlo as fused

    with _LOCK:
        original = fused.check_cudnn_version
        fused.check_cudnn_version = lambda: NOMINAL_CUDNN_VERSION
        try:
            yield
        finally:
            fused.check_cudnn_version = original


def cudnn_dot_product_attention(
    query, key, value, *, query_seq_lengths=None, key_value_seq_lengths=None, **kwargs
):
    """``jax.nn.dot_product_attention(query, key, value, implementation="cudnn", ...)``
    (``query [B,T,N,H]``, ``key, value [B,S,K,H]`` -> ``[B,T,N,H]``; lengths ``[B]`` int32)
    that traces on any host and takes odd lengths under ``grad``: see the module docstring.
    The program it builds lowers for ``cuda`` only."""
    (B, T), S = query.shape[:2], key.shape[1]
    if T % 2 or S % 2:
        if query_seq_lengths is None:
            query_seq_lengths = jnp.full((B,), T, jnp.int32)
        if key_value_seq_lengths is None:
            key_value_seq_lengths = jnp.full((B,), S, jnp.int32)
        pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n % 2), (0, 0), (0, 0)))  # noqa: E731
        query, key, value = pad(query, T), pad(key, S), pad(value, S)
    with _nominal_cudnn_version():
        out = jax.nn.dot_product_attention(
            query,
            key,
            value,
            implementation="cudnn",
            query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths,
            **kwargs,
        )
    return out[:, :T]


# ---- GPU lowering on a host without a GPU ------------------------------------------------
#
# jax 0.11.2 asks for the target GPU's compute capability while it lowers a Pallas Triton
# kernel (``jax._src.pallas.triton.pallas_call_registration``) and, on a host without a GPU,
# raises ``RuntimeError: No supported GPU devices found, please specify an abstract GPU device
# using AbstractDevice``; jax 0.10.2 lowered without asking. Naming the target as the abstract
# mesh's device, the route that message gives, answers it on both versions. Goes never: it is
# the public way to say which GPU a program is built for.

NOMINAL_GPU = "NVIDIA H100"  # the kind named when lowering for cuda on a host without a GPU


@contextlib.contextmanager
def gpu_lowering_target(device_kind: str = NOMINAL_GPU):
    """While open, ``jit(...).lower(lowering_platforms=("cuda",))`` and ``jax.export`` for
    ``cuda`` build Pallas Triton kernels for ``device_kind`` on a host without a GPU (the
    current mesh's axes are kept). A no-op where jax's default backend is a GPU."""
    if jax.default_backend() == "gpu":
        yield
        return
    device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu")
    mesh = jax.sharding.get_abstract_mesh().update(abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        yield


# ---- jax version ----------------------------------------------------------------------

JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__)
# Each (major, minor) the whole test suite has passed on. Widen the jax range in
# pyproject.toml (dependencies and the cuda12/cuda13/tpu extras) in the same commit.
TESTED_JAX_MINORS: tuple[tuple[int, int], ...] = ((0, 10), (0, 11))


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


# ---- Pallas Triton deprecation ----------------------------------------------------------
#
# jax 0.11 deprecates the Pallas Triton backend: every Triton lowering (a Pallas kernel built
# for cuda) warns, through jax's deprecation registry (id "jax-pallas-triton"), that the
# kernel's author should migrate to Mosaic GPU; the kernel still lowers and runs. jax 0.10
# says nothing. The author here is tfmjax (the GPU kernel of ``kernels/pallas_attention.py``),
# so the warning tells a user nothing they can act on: Python's default filters hide it
# anyway (it is raised from jax's code, not ``__main__``), and the test suite, which shows
# every warning, ignores it by this pattern (``tests/conftest.py``). ``tests/test_compat.py``
# pins which jax versions issue it. Goes with the Triton kernel.

PALLAS_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"  # the message's start


def pallas_triton_is_deprecated(version: tuple[int, ...] = JAX_VERSION) -> bool:
    """Whether this jax (or ``version``) warns on every Pallas Triton lowering."""
    return tuple(version[:2]) >= (0, 11)
