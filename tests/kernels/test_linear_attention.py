"""Kernelised linear attention (tfmjax.kernels.linear) against its quadratic reference.

The chunked causal scan, the global non-causal sums and the recurrent decoding steps must
all equal ``linear_attention_reference`` (``A = phi(Q) phi(K)^T``, masked,
``A V / (A 1 + eps)``) in values and gradients: float32, max abs error at most 2e-5 of the
largest magnitude (rounding of two summation orders). FAVOR+ is also checked against exact
softmax attention (statistically, with fixed keys) and, where the plain float32 form
overflows, against a float64 computation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels import linear
from tfmjax.kernels.testing import value_and_grads

RTOL = 2e-5

# Whole functions jitted: one compilation each, not one per primitive as eager calls.
attend = jax.jit(
    linear.linear_attention, static_argnames=("causal", "feature_map", "chunk_size", "eps")
)
attend_reference = jax.jit(
    linear.linear_attention_reference, static_argnames=("causal", "feature_map", "eps")
)
F_FAVOR = 12  # not a multiple of H=8: the last orthogonal block is cut


def projection_for(kind, H, F=F_FAVOR, seed=7):
    return linear.favor_projection(jax.random.key(seed), F, H) if kind == "favor" else None


def random_inputs(B, T, S, N, K, H, dtype, seed=0):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]``, ``d_out [B,T,N,H]``, standard normal (numpy's
    generator: no compilation per shape, unlike ``jax.random``)."""
    rng = np.random.default_rng(seed)
    shapes = ((B, T, N, H), (B, S, K, H), (B, S, K, H), (B, T, N, H))
    return [jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for shape in shapes]


def kv_mask(B, S, kind):
    """``[B,S]`` int mask: ``"left"`` pads the start of row 0, ``"right"`` the end of row 1."""
    mask = np.ones((B, S), np.int32)
    if kind == "left":
        mask[0, :3] = 0
    elif kind == "right":
        mask[-1, S - 4 :] = 0
    return None if kind is None else jnp.asarray(mask)


def assert_rel_close(got, want, rtol=RTOL):
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert np.all(np.isfinite(g)), f"{name} has non-finite values"
        err, scale = np.max(np.abs(g - w)), np.max(np.abs(w))
        assert err <= rtol * scale, f"{name}: max abs error {err:.2e} > {rtol} x {scale:.2e}"


# name: (B, T, N, K, H, chunk_size, kv_mask)
# (A chunk longer than T: the decoding steps below, chunk_size=64.)
CAUSAL_CASES = {
    "gqa2_ragged_chunk5_leftpad": (2, 13, 4, 2, 8, 5, "left"),
    "mqa_chunk1": (1, 7, 4, 1, 8, 1, None),
    "mha_exact_multiple_chunk8_rightpad": (2, 16, 4, 4, 8, 8, "right"),
}


@pytest.mark.parametrize("kind", linear.FEATURE_MAPS)
@pytest.mark.parametrize("case", list(CAUSAL_CASES))
def test_chunked_causal_equals_reference_values_and_grads(case, kind):
    B, T, N, K, H, chunk, mask = CAUSAL_CASES[case]
    q, k, v, d_out = random_inputs(B, T, T, N, K, H, jnp.float32)
    kw = dict(causal=True, feature_map=kind, projection=projection_for(kind, H))
    kw["kv_mask"] = kv_mask(B, T, mask)
    got = value_and_grads(linear.linear_attention, q, k, v, d_out, **kw, chunk_size=chunk)
    want = value_and_grads(linear.linear_attention_reference, q, k, v, d_out, **kw)
    assert_rel_close(got, want)
    if mask == "left":  # a query that sees only padding returns zeros
        np.testing.assert_array_equal(np.asarray(got[0][0, :3]), 0.0)


# name: (B, T, S, N, K, H, kv_mask)
NONCAUSAL_CASES = {
    "cross_gqa2_rightpad": (2, 9, 14, 4, 2, 8, "right"),
    "cross_mqa_leftpad": (2, 15, 6, 4, 1, 8, "left"),
}


@pytest.mark.parametrize("kind", linear.FEATURE_MAPS)
@pytest.mark.parametrize("case", list(NONCAUSAL_CASES))
def test_noncausal_equals_reference_values_and_grads(case, kind):
    B, T, S, N, K, H, mask = NONCAUSAL_CASES[case]
    q, k, v, d_out = random_inputs(B, T, S, N, K, H, jnp.float32, seed=1)
    kw = dict(causal=False, feature_map=kind, projection=projection_for(kind, H))
    kw["kv_mask"] = kv_mask(B, S, mask)
    got = value_and_grads(linear.linear_attention, q, k, v, d_out, **kw)
    want = value_and_grads(linear.linear_attention_reference, q, k, v, d_out, **kw)
    assert_rel_close(got, want)


@pytest.mark.parametrize("kind", linear.FEATURE_MAPS)
@pytest.mark.parametrize("pieces", [[1] * 9, [3, 1, 5]], ids=["token_by_token", "3_1_5"])
def test_recurrent_steps_equal_parallel_causal(pieces, kind):
    B, T, N, K, H = 2, sum(pieces), 4, 2, 8
    q, k, v, _ = random_inputs(B, T, T, N, K, H, jnp.float32, seed=2)
    mask = kv_mask(B, T, "left")  # a left-padded prompt in row 0
    proj = projection_for(kind, H)
    kw = dict(feature_map=kind, projection=proj)
    want = attend(q, k, v, causal=True, kv_mask=mask, chunk_size=4, **kw)
    F = H if kind == "elu" else F_FAVOR
    state = linear.init_linear_state(B, K, F, H)
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    assert shapes == {
        "s": ((B, K, F, H), jnp.float32),
        "z": ((B, K, F), jnp.float32),
        "m": ((B, K), jnp.float32),
    }
    step = jax.jit(
        lambda st, q, k, v, m: linear.linear_attention_step(st, q, k, v, **kw, kv_mask=m)
    )
    outs, start = [], 0
    for n in pieces:
        sl = slice(start, start + n)
        out, state = step(state, q[:, sl], k[:, sl], v[:, sl], mask[:, sl])
        assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
        outs.append(out)
        start += n
    got = np.concatenate([np.asarray(o) for o in outs], axis=1)
    want = np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=0, atol=RTOL * np.max(np.abs(want)))


def test_bfloat16_inputs_sum_in_float32():
    q, k, v, _ = random_inputs(2, 40, 40, 4, 2, 8, jnp.bfloat16, seed=3)
    out = attend(q, k, v, causal=True, chunk_size=16)
    assert out.dtype == jnp.bfloat16
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = attend_reference(*f32, causal=True)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want), atol=2e-2)


def _softmax_attention(q, k, v):
    scores = jnp.einsum("BTNH,BSNH->BNTS", q, k) / q.shape[-1] ** 0.5
    return jnp.einsum("BNTS,BSNH->BTNH", jax.nn.softmax(scores, axis=-1), v)


def test_favor_error_vs_softmax_shrinks_with_more_features():
    # Statistical, with fixed keys: the FAVOR+ estimate's error ~ 1/sqrt(F) (measured here:
    # ~0.06 at F=16, ~0.02 at F=256, the same under 4 other projection keys).
    B, T, N, H = 2, 32, 2, 16
    q, k, v, _ = random_inputs(B, T, T, N, N, H, jnp.float32, seed=4)
    q, k = 0.5 * q, 0.5 * k  # modest scale: |q . k| / sqrt(H) mostly below 1
    exact = _softmax_attention(q, k, v)
    errors = {}
    for F in (16, 256):
        proj = linear.favor_projection(jax.random.key(0), F, H)
        out = attend(q, k, v, causal=False, feature_map="favor", projection=proj)
        errors[F] = float(jnp.mean(jnp.abs(out - exact)))
    assert errors[256] < 0.5 * errors[16], errors
    assert errors[256] < 0.05, errors


def test_feature_maps_are_positive_with_the_right_shapes():
    x = 2.0 * random_inputs(3, 50, 50, 1, 1, 16, jnp.float32, seed=5)[0][:, :, 0]
    proj = linear.favor_projection(jax.random.key(6), 40, 16)
    phi = linear.apply_feature_map(x, "favor", proj)
    assert phi.shape == (3, 50, 40) and bool(jnp.all(phi > 0))
    phi = linear.apply_feature_map(-20.0 + 3.0 * x, "elu")  # down to about -45
    assert phi.shape == (3, 50, 16) and bool(jnp.all(phi > 0))


def test_favor_projection_is_deterministic_block_orthogonal_and_gaussian_sized():
    H, F = 16, 40
    a = linear.favor_projection(jax.random.key(0), F, H)
    np.testing.assert_array_equal(
        np.asarray(a), np.asarray(linear.favor_projection(jax.random.key(0), F, H))
    )
    assert not np.allclose(
        np.asarray(a), np.asarray(linear.favor_projection(jax.random.key(1), F, H))
    )
    assert a.shape == (F, H) and a.dtype == jnp.float32
    a = np.asarray(a, np.float64)
    unit = a / np.linalg.norm(a, axis=1, keepdims=True)
    for start in range(0, F, H):  # rows within one block are orthogonal
        block = unit[start : start + H]
        np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=1e-5)
    # Row norms are chi(H)-distributed: E|w|^2 = H (loose: 40 samples).
    assert 0.6 * H < np.mean(np.sum(a * a, axis=1)) < 1.4 * H


def _favor_float64(q, k, v, proj, eps=1e-6):
    """Causal FAVOR+ linear attention in numpy float64 (MHA)."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, proj))
    F, H = w.shape

    def phi(x):
        x = x * H**-0.25
        return np.exp(x @ w.T - 0.5 * np.sum(x * x, axis=-1, keepdims=True)) / np.sqrt(F)

    a = np.einsum("BTNF,BSNF->BNTS", phi(q), phi(k)) * np.tril(np.ones((q.shape[1],) * 2))
    den = np.einsum("BNTS->BTN", a) + eps
    return np.einsum("BNTS,BSNH->BTNH", a, v) / den[..., None]


def test_favor_stabiliser_stays_exact_where_plain_float32_overflows():
    # Queries and keys near rows of W: log phi ~ |w|^2 / 2 ~ H / 2 = 64, so phi(q) . phi(k)
    # ~ e^128 overflows float32 in the plain form; the stabilised form matches float64.
    B, T, N, H, F = 1, 10, 2, 128, 8
    proj = linear.favor_projection(jax.random.key(8), F, H)
    rows = H**0.25 * np.asarray(proj)[np.arange(B * T * N) % F].reshape(B, T, N, H)
    noise = random_inputs(B, T, T, N, N, H, jnp.float32, seed=9)
    q, k, v = rows + 0.3 * noise[0], rows + 0.3 * noise[1], noise[2]
    plain = attend_reference(q, k, v, causal=True, feature_map="favor", projection=proj)
    assert not np.all(np.isfinite(np.asarray(plain)))  # the test bites
    want = _favor_float64(q, k, v, proj)
    # float32 against float64 at feature values near e^64 relative to each other: within
    # 1e-4 of the output's scale (jax 0.10 lands within 1e-5, jax 0.11's XLA:CPU within 2e-5;
    # the plain form above gives inf or nan)
    for chunk in (3, 64):
        got = attend(q, k, v, causal=True, feature_map="favor", projection=proj, chunk_size=chunk)
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-4 * np.max(np.abs(want)))


def test_causal_memory_is_linear_in_length():
    # Compile only: fwd+bwd temp buffers grow ~linearly (4x the length: at most 5x bytes).
    def temp_bytes(T):
        x = jax.ShapeDtypeStruct((1, T, 4, 64), jnp.float32)
        loss = lambda q, k, v: jnp.sum(linear.linear_attention(q, k, v, causal=True))
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(x, x, x).lower().compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temp_bytes(2048), temp_bytes(8192)
    assert large <= 5 * small, (small, large)
    assert large < 8192 * 8192 * 4, large  # far below one T x T float32 array


def _bad_calls():
    q = jnp.zeros((1, 6, 4, 8))
    k = jnp.zeros((1, 6, 2, 8))
    k_short = jnp.zeros((1, 5, 2, 8))
    proj = linear.favor_projection(jax.random.key(0), 4, 8)
    att = linear.linear_attention
    return {
        "unknown_feature_map": (lambda: att(q, k, k, causal=False, feature_map="relu"), "relu"),
        "causal_t_ne_s": (lambda: att(q, k_short, k_short, causal=True), "T == S"),
        "favor_without_projection": (
            lambda: att(q, k, k, causal=False, feature_map="favor"),
            "needs projection",
        ),
        "projection_wrong_width": (
            lambda: att(q, k, k, causal=False, feature_map="favor", projection=proj[:, :4]),
            "projection must be",
        ),
        "elu_with_projection": (
            lambda: att(q, k, k, causal=False, projection=proj),
            "takes no projection",
        ),
        "heads_not_divisible": (
            lambda: att(q, jnp.zeros((1, 6, 3, 8)), jnp.zeros((1, 6, 3, 8)), causal=False),
            "multiple",
        ),
        "kv_mask_shape": (lambda: att(q, k, k, causal=False, kv_mask=jnp.ones((1, 5))), "kv_mask"),
        "chunk_size_zero": (lambda: att(q, k, k, causal=True, chunk_size=0), "chunk_size"),
        "eps_zero": (lambda: att(q, k, k, causal=True, eps=0.0), "eps"),
        "step_state_shape": (
            lambda: linear.linear_attention_step(linear.init_linear_state(1, 4, 8, 8), q, k, k),
            "state shapes",
        ),
        "reference_unknown_feature_map": (
            lambda: linear.linear_attention_reference(q, k, k, causal=False, feature_map="x"),
            "feature_map",
        ),
    }


@pytest.mark.parametrize("name", list(_bad_calls()))
def test_bad_arguments_raise_one_line_value_errors(name):
    call, match = _bad_calls()[name]
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
