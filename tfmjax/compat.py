"""Differences between jax versions, and the few places tfmjax leans on jax internals.

Every entry says which jax versions it was written against, why it exists, and what would
let it go. Nothing else in tfmjax imports ``jax._src``; keep it that way, and keep this
module small.

* :func:`cudnn_dot_product_attention` -- ``jax.nn.dot_product_attention(...,
  implementation="cudnn")`` that can also be traced on a host without CUDA (jax 0.10.2; the
  same code is in jax 0.11.1). The public function asks the local jaxlib for its cuDNN
  version at trace time (``jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version``)
  and raises ``RuntimeError("cuDNN is not detected.")`` where the CUDA plugin is not
  installed, although nothing else in tracing or in lowering for ``cuda`` needs a GPU. On
  such a host (only there) the query answers :data:`NOMINAL_CUDNN_VERSION` while the call is
  traced, so a CPU machine can lower or ``jax.export`` cuDNN attention for ``cuda``. Goes
  when jax stops querying the local cuDNN at trace time.
"""

from __future__ import annotations

import contextlib
import threading

import jax

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


def cudnn_dot_product_attention(query, key, value, **kwargs):
    """``jax.nn.dot_product_attention(query, key, value, implementation="cudnn", **kwargs)``
    (``query [B,T,N,H]``, ``key, value [B,S,K,H]`` -> ``[B,T,N,H]``), traceable on any host:
    see the module docstring. The program it builds lowers for ``cuda`` only."""
    with _nominal_cudnn_version():
        return jax.nn.dot_product_attention(query, key, value, implementation="cudnn", **kwargs)
