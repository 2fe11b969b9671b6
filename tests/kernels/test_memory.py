"""impl="blockwise" needs O(T) memory: compiled fwd+bwd temp buffers grow ~linearly in T.

Compile only (``memory_analysis``), nothing runs: B=1, N=8, H=64, causal, float32. From
T=2048 to T=8192 (4x) the reference's T x S buffers grow ~16x; blockwise's may grow at
most 5x (4x plus fixed-size per-block buffers).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfmjax.kernels import blockwise, reference


def _temp_bytes(impl, T):
    q = jax.ShapeDtypeStruct((1, T, 8, 64), jnp.float32)

    def loss(q, k, v):
        out = impl.attention(
            q,
            k,
            v,
            causal=True,
            q_segment_ids=None,
            kv_segment_ids=None,
            window=None,
            alibi_slopes=None,
            bias=None,
            q_offset=0,
            scale=0.125,
        )
        return jnp.sum(out * out)

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(q, q, q).lower().compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_temp_memory_is_linear_in_length():
    small, large = _temp_bytes(blockwise, 2048), _temp_bytes(blockwise, 8192)
    ref_small, ref_large = _temp_bytes(reference, 2048), _temp_bytes(reference, 8192)
    assert large <= 5 * small, (small, large)
    assert ref_large >= 12 * ref_small, (ref_small, ref_large)  # quadratic, for contrast
    assert large * 50 <= ref_large, (large, ref_large)
