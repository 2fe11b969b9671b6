"""Finite, equal gradients whatever XLA's optimisation level: the ALiBi cases whose query and
key gradients once came out infinite when compiled at ``xla_backend_optimization_level=0``.

The cause was the reference's softmax: its row-max shift let the gradient through, and jax's
rule for ``max`` splits it among the entries equal to the maximum. An unoptimised build
computes the ALiBi scores twice, one of them with the add fused into one rounding, so no
entry equalled the maximum and the split divided by zero. The shift now stops the gradient
(:func:`tfmjax.kernels.reference.softmax_rows`), as ``jax.nn.softmax`` does; the blockwise
and Pallas kernels never differentiated through theirs. Here every side (kernel and
reference) is compiled with XLA's backend optimisations off, the way the failure was seen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tfmjax.kernels import blockwise, masks, pallas_attention, reference
from tfmjax.kernels.testing import assert_close, call_kwargs, random_inputs

LEVEL_ZERO = {"xla_backend_optimization_level": 0}
KERNELS = {
    "blockwise": lambda *a, **kw: blockwise.attention(
        *a,
        **kw,
        block_sizes=blockwise.BlockSizes(
            block_q=8, block_k=8, block_q_bwd=4, block_k_bwd=8, kv_heads_per_step=2
        ),
    ),
    "pallas": lambda *a, **kw: pallas_attention.attention(
        *a, **kw, block_sizes=pallas_attention.BlockSizes(8, 8, 8, 8, 8, 8)
    ),
}
# name: (kernel, (B, T, S, N, K, H), options): the cases that failed at level 0.
CASES = {
    "blockwise-alibi_causal": ("blockwise", (1, 20, 20, 4, 2, 8), dict(causal=True, alibi=4)),
    "blockwise-q_offset_window_alibi": (
        "blockwise",
        (1, 12, 30, 2, 1, 8),
        dict(causal=True, q_offset=18, window=7, alibi=2),
    ),
    "pallas-mqa_window_bidirectional_alibi": (
        "pallas",
        (1, 22, 31, 4, 1, 8),
        dict(window=6, alibi=4),
    ),
}


def level_zero_results(fn, q, k, v, d_out, **kw):
    """``(out, dq, dk, dv)`` of ``fn``, compiled at XLA's optimisation level 0."""

    def run(q, k, v, d_out):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **kw), q, k, v)
        return (out, *vjp(d_out))

    compiled = jax.jit(run).lower(q, k, v, d_out).compile(compiler_options=LEVEL_ZERO)
    return compiled(q, k, v, d_out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_are_finite_and_equal_at_level_zero(name):
    kernel, shape, options = CASES[name]
    options = dict(options)
    options["alibi_slopes"] = masks.alibi_slopes(options.pop("alibi"))
    q, k, v, d_out = random_inputs(*shape, jnp.float32)
    kw = call_kwargs(shape[-1], **options)
    want = level_zero_results(reference.attention, q, k, v, d_out, **kw)
    for part, x in zip(("out", "dq", "dk", "dv"), want, strict=True):
        assert bool(jnp.all(jnp.isfinite(x))), f"the reference's {part} is not finite"
    assert_close(level_zero_results(KERNELS[kernel], q, k, v, d_out, **kw), want, jnp.float32)
