"""Differences between jax versions, and the few places tfmjax leans on jax internals.

Every entry says which jax versions it was written against, why it exists, and what would
let it go. Nothing else in tfmjax imports ``jax._src``; keep it that way, and keep this
module small.

* :func:`cudnn_dot_product_attention` -- ``jax.nn.dot_product_attention(...,
  implementation="cudnn")`` that can also be traced on a host without CUDA (jax 0.10.2;
  unchanged in jax's source at 0.11.1). The public function asks the local jaxlib for its cuDNN
  version at trace time (``jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version``)
  and raises ``RuntimeError("cuDNN is not detected.")`` where the CUDA plugin is not
  installed, although nothing else in tracing or in lowering for ``cuda`` needs a GPU. On
  such a host (only there) the query answers :data:`NOMINAL_CUDNN_VERSION` while the call is
  traced, so a CPU machine can lower or ``jax.export`` cuDNN attention for ``cuda``. Goes
  when jax stops querying the local cuDNN at trace time.

  And odd lengths (same versions): the public function hands its custom VJP a placeholder
  bias (``jnp.zeros(0)``) when there is none, so the check meant for a real bias --
  ``NotImplementedError: Unsupported sequence length`` unless ``T`` and ``S`` are even --
  applies to every call that is differentiated. An odd ``T`` or ``S`` is padded by one
  slot here, masked by the per-row lengths, and the padded query row is dropped. Goes when
  jax checks the real bias only.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp

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
