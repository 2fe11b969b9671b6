"""The Pallas kernel compiled by Triton on a CUDA GPU against the reference: values and
gradients at block sizes Triton takes (16 and up; the interpret-mode tests in
``test_pallas.py`` use 8, which on a GPU leave the Triton branch out).

Needs a CUDA GPU; on the CPU hosts of CI it is skipped and ``test_pallas.py`` (interpret
mode, the same kernel bodies) and ``test_lowering.py`` (the Triton lowering) stand for it.
fp32 cases run at ``jax_default_matmul_precision="highest"`` (at the default, XLA and Triton
use TF32 dots, ~1e-3); tolerances as ``tfmjax.kernels.testing.TOLERANCE``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tfmjax.kernels import masks, pallas_attention, reference
from tfmjax.kernels.testing import (
    assert_close,
    call_kwargs,
    random_inputs,
    segment_ids,
    value_and_grads,
)

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu", reason="Triton kernels run on a CUDA GPU only"
)

# name: (B, T, S, N, K, H, dtype, options, (query block, key block))
CASES = {
    "causal_gqa2_fp32": (2, 256, 256, 4, 2, 64, jnp.float32, dict(causal=True), (64, 64)),
    "full_ragged_mha_fp32": (1, 200, 328, 4, 4, 64, jnp.float32, {}, (32, 64)),
    "window_alibi_mqa_fp32": (
        1,
        192,
        192,
        4,
        1,
        32,
        jnp.float32,
        dict(causal=True, window=40, alibi_slopes=masks.alibi_slopes(4)),
        (32, 32),
    ),  # fmt: skip
    "causal_gqa4_bf16": (2, 512, 512, 8, 2, 128, jnp.bfloat16, dict(causal=True), (64, 64)),
    "offset_bf16": (1, 64, 320, 4, 2, 64, jnp.bfloat16, dict(causal=True, q_offset=256), (16, 64)),
}


def _assert_triton_matches_reference(blocks, dtype, q, k, v, d_out, kw):
    """Values and gradients of the Pallas kernel with ``blocks`` against the reference."""
    with jax.default_matmul_precision("highest"):
        got = value_and_grads(
            lambda *a, **o: pallas_attention.attention(*a, **o, block_sizes=blocks),
            q, k, v, d_out, **kw,
        )  # fmt: skip
        want = value_and_grads(reference.attention, q, k, v, d_out, **kw)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_matches_reference(name):
    B, T, S, N, K, H, dtype, options, (bq, bk) = CASES[name]
    blocks = pallas_attention.BlockSizes(bq, bk, bq, bk, bq, bk)
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, dtype)
    _assert_triton_matches_reference(blocks, dtype, q, k, v, d_out, call_kwargs(H, **options))


def test_triton_segments_and_padding():
    T = S = 128
    q, k, v, d_out = random_inputs(2, T, S, 4, 2, 64, jnp.float32, seed=1)
    spec = [[(1, 50), (2, 60), (0, 18)], [(1, 128)]]
    kw = call_kwargs(
        64, causal=True, q_segment_ids=segment_ids(T, spec), kv_segment_ids=segment_ids(S, spec)
    )
    blocks = pallas_attention.BlockSizes(32, 32, 32, 32, 32, 32)
    _assert_triton_matches_reference(blocks, jnp.float32, q, k, v, d_out, kw)
