"""``lax.dot_general`` of a dense layer as one 2-D matmul: ``[..., K] x [K, ...]`` folded to
``[M, K] x [K, N]`` and unfolded after.

Same contraction, same result shape. Why: XLA:CPU lays out the weight gradient of a
``[B,T,D] x [D,F]`` dot_general (a contraction over B and T) with a transposed copy of the
``[B,T,F]`` cotangent, fused into the elementwise backward before it; with the operands
folded to 2-D it contracts in place. On the shakespeare_char step those copies were a quarter
of the step (docs/cpu_speed.md). Other dot_generals (batch dimensions, contractions not over
the trailing lhs / leading rhs dimensions) go to ``lax.dot_general`` unchanged.
"""

from __future__ import annotations

import math

from jax import lax


def folded_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """``lax.dot_general`` with the signature Flax's ``Dense(dot_general=...)`` takes."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    k = len(lhs_contract)
    lhs_contract = tuple(d % lhs.ndim for d in lhs_contract)
    foldable = (
        not lhs_batch
        and not rhs_batch
        and lhs_contract == tuple(range(lhs.ndim - k, lhs.ndim))
        and tuple(rhs_contract) == tuple(range(k))
        and lhs.ndim - k >= 1
    )
    if not foldable or (lhs.ndim == 2 and rhs.ndim == 2):
        return lax.dot_general(
            lhs, rhs, dimension_numbers, precision, preferred_element_type=preferred_element_type
        )
    lead, inner, trail = lhs.shape[: lhs.ndim - k], lhs.shape[lhs.ndim - k :], rhs.shape[k:]
    out = lax.dot_general(
        lhs.reshape(math.prod(lead), math.prod(inner)),
        rhs.reshape(math.prod(inner), math.prod(trail)),
        (((1,), (0,)), ((), ())),
        precision,
        preferred_element_type=preferred_element_type,
    )
    return out.reshape(*lead, *trail)
