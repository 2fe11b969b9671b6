"""The Pallas kernels lower for GPU (Triton) and TPU (Mosaic) from this CPU-only machine.

``jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))`` runs the Pallas ->
Triton IR and Pallas -> Mosaic lowerings, forward and backward (both backward kernels),
each platform on its own. It does not run the Triton or Mosaic compilers (those need the
device), so it catches unsupported ops, layouts and block shapes in the kernels and
wrappers, not register or VMEM pressure.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tfmjax.compat import gpu_lowering_target, triton_custom_call_target
from tfmjax.kernels import masks, pallas_attention


def _lower(platform, fn, *args):
    with gpu_lowering_target():
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))
    text = lowered.as_text()
    assert text, "empty module"
    return text


# (B, T, S, N, K, H, dtype, options): a plain case, one with every feature on, and one
# with the sparse patterns.
CONFIGS = {
    "causal_bf16": (1, 256, 256, 4, 2, 64, jnp.bfloat16, dict(causal=True)),
    "all_features_ragged_mqa": (
        2,
        200,
        300,
        4,
        1,
        64,
        jnp.float32,
        dict(
            causal=True,
            window=96,
            alibi_slopes=masks.alibi_slopes(4),
            q_segment_ids=jnp.ones((2, 200), jnp.int32),
            kv_segment_ids=jnp.ones((2, 300), jnp.int32),
        ),
    ),
    # The sparse patterns (strided, global tokens): rem and the extra global-block loop.
    "sparse_patterns_gqa2": (
        1,
        64,
        96,
        4,
        2,
        32,
        jnp.float32,
        dict(causal=True, window=8, stride=16, global_tokens=4),
    ),
    # BigBird: window + global + random blocks, whose candidate blocks are a lax.cond on a
    # scalar hash loop in every kernel.
    "bigbird_gqa2": (
        1,
        64,
        64,
        4,
        2,
        32,
        jnp.float32,
        dict(
            causal=True, window=8, global_tokens=4, random_blocks=masks.RandomBlocks(2, 16, seed=1)
        ),
    ),
}


@pytest.mark.parametrize("traced_offset", [False, True], ids=["static_offset", "traced_offset"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_forward_and_grad_lower(platform, config, traced_offset):
    B, T, S, N, K, H, dtype, options = CONFIGS[config]
    q = jnp.zeros((B, T, N, H), dtype)
    kv = jnp.zeros((B, S, K, H), dtype)
    kw = dict(
        dict(
            causal=False,
            q_segment_ids=None,
            kv_segment_ids=None,
            window=None,
            alibi_slopes=None,
            bias=None,
            scale=H**-0.5,
        ),
        **options,
    )

    def forward(q, k, v, offset):
        return pallas_attention.attention(
            q, k, v, **kw, q_offset=offset if traced_offset else 7, platform=platform
        )

    def loss(q, k, v, offset):
        return jnp.sum(forward(q, k, v, offset).astype(jnp.float32) ** 2)

    text = _lower(platform, forward, q, kv, kv, jnp.int32(7))
    grad_text = _lower(platform, jax.grad(loss, argnums=(0, 1, 2)), q, kv, kv, jnp.int32(7))
    marker = f"@{triton_custom_call_target()}(" if platform == "cuda" else "@tpu_custom_call("
    assert text.count(marker) == 1  # the forward kernel
    assert grad_text.count(marker) == 3  # forward, dQ and dK/dV kernels
