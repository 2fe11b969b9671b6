"""The attention entry point: reference == softmax(QK^T/sqrt(H) + mask) V per head,
xla == reference (values, grads)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels import attention, choose_impl
from tfmjax.kernels.masks import alibi_slopes


def numpy_attention(q, k, v, mask, scale):
    """Scaled dot-product attention (Vaswani et al. 2017) per head, loop for loop:
    q [T,N,H], k/v [S,K,H]."""
    T, N, H = q.shape
    group = N // k.shape[1]
    out = np.zeros((T, N, H))
    for n in range(N):
        e = q[:, n] @ k[:, n // group].T * scale
        e = np.where(mask[n] if mask.ndim == 3 else mask, e, -np.inf)
        for t in range(T):
            if np.isinf(e[t]).all():
                continue  # nothing to attend to: zeros
            a = np.exp(e[t] - e[t].max())
            out[t, n] = (a / a.sum()) @ v[:, n // group]
    return out


def _inputs(B=2, T=5, S=7, N=4, K=2, H=8, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (B, T, N, H), dtype),
        jax.random.normal(kk, (B, S, K, H), dtype),
        jax.random.normal(kv, (B, S, K, H), dtype),
    )


def test_reference_is_pseudo_algorithm_2_5():
    q, k, v = _inputs(B=1, T=4, S=6, N=4, K=2)
    T, S = 4, 6
    causal_mask = np.arange(S)[None, :] <= np.arange(T)[:, None] + 2  # q_offset = 2
    got = attention(q, k, v, causal=True, q_offset=2, impl="reference")
    want = numpy_attention(
        *(np.asarray(x[0], np.float64) for x in (q, k, v)), causal_mask, 1 / np.sqrt(8)
    )
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_reference_alibi_matches_numpy():
    q, k, v = _inputs(B=1, T=5, S=5, N=4, K=4)
    slopes = np.asarray(alibi_slopes(4))
    i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    # ALiBi as an additive bias: fold it into q.k by computing the scores in numpy directly.
    qn, kn, vn = (np.asarray(x[0], np.float64) for x in (q, k, v))
    out = np.zeros_like(qn)
    for n in range(4):
        e = qn[:, n] @ kn[:, n].T / np.sqrt(8) - slopes[n] * np.abs(i - j)
        a = np.exp(e - e.max(-1, keepdims=True))
        out[:, n] = (a / a.sum(-1, keepdims=True)) @ vn[:, n]
    got = attention(q, k, v, alibi_slopes=jnp.asarray(slopes), impl="reference")
    np.testing.assert_allclose(got[0], out, rtol=1e-5, atol=1e-5)


SEGMENTS = {
    "none": None,
    "padding": (
        jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
        jnp.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]]),
    ),
    "packing": (
        jnp.array([[1, 1, 2, 2, 2], [1, 2, 2, 3, 0]]),
        jnp.array([[1, 1, 1, 2, 2, 2, 0], [1, 2, 2, 3, 3, 0, 0]]),
    ),
}

GRID = [
    dict(causal=c, K=K, segments=s, window=w, alibi=a, bias=b, q_offset=o)
    for c, K, s, w, a, b, o in itertools.product(
        [False, True],
        [4, 2, 1],
        ["none", "padding", "packing"],
        [None, 2],
        [False, True],
        [False, True],
        [0, 2],
    )
    # keep the grid to every pairing that matters: offsets only when causal, bias with MHA
    if (o == 0 or c) and not (b and K != 4)
]


@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_xla_equals_reference_values_and_grads(case):
    q, k, v = _inputs(K=case["K"])  # T=5 != S=7, N=4: GQA ratios 1, 2, 4
    kw = dict(causal=case["causal"], window=case["window"], q_offset=case["q_offset"])
    if case["segments"] != "none":
        kw["q_segment_ids"], kw["kv_segment_ids"] = SEGMENTS[case["segments"]]
    if case["alibi"]:
        kw["alibi_slopes"] = alibi_slopes(4)
    if case["bias"]:
        kw["bias"] = jax.random.normal(jax.random.key(5), (1, 4, 5, 7))
    cot = jax.random.normal(jax.random.key(9), q.shape)

    def loss(impl):
        return lambda q, k, v: jnp.sum(attention(q, k, v, impl=impl, **kw) * cot)

    ref_out = attention(q, k, v, impl="reference", **kw)
    xla_out = attention(q, k, v, impl="xla", **kw)
    np.testing.assert_allclose(xla_out, ref_out, rtol=1e-5, atol=1e-5)
    ref_grads = jax.grad(loss("reference"), argnums=(0, 1, 2))(q, k, v)
    xla_grads = jax.grad(loss("xla"), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", xla_grads, ref_grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")
        assert np.isfinite(np.asarray(a)).all()


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_rows_with_nothing_to_attend_are_zero(impl):
    q, k, v = _inputs(K=4)
    q_seg = jnp.array([[1, 1, 0, 0, 3], [0, 0, 0, 0, 0]])  # 0 and 3 see nothing
    kv_seg = jnp.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    out = attention(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, impl=impl)
    assert not np.isnan(np.asarray(out)).any()
    np.testing.assert_array_equal(np.asarray(out)[0, 2:], 0.0)
    np.testing.assert_array_equal(np.asarray(out)[1], 0.0)
    grads = jax.grad(
        lambda q: attention(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, impl=impl).sum()
    )(q)
    assert np.isfinite(np.asarray(grads)).all()


def test_bf16_xla_close_to_reference():
    q, k, v = _inputs(K=2, dtype=jnp.bfloat16)
    a = attention(q, k, v, causal=True, impl="xla").astype(jnp.float32)
    b = attention(q, k, v, causal=True, impl="reference").astype(jnp.float32)
    np.testing.assert_allclose(a, b, atol=2e-2, rtol=2e-2)  # bf16 has ~3 significant digits


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(impl="fast"), "impl='fast' is not one of"),
        (
            dict(q_segment_ids=jnp.ones((2, 5), jnp.int32)),
            "pass both q_segment_ids and kv_segment_ids",
        ),
        (dict(alibi_slopes=jnp.ones(3)), r"alibi_slopes must have shape \[N=4\]"),
        (dict(window=-1), "window=-1 must be >= 0"),
        (dict(bias=jnp.ones((1, 4, 5, 5))), "bias must be"),
    ],
)
def test_bad_arguments_are_one_line(kwargs, message):
    q, k, v = _inputs(K=2)
    with pytest.raises(ValueError, match=message):
        attention(q, k, v, **kwargs)


def test_heads_must_divide():
    q, k, v = _inputs(N=4, K=3)
    with pytest.raises(ValueError, match="multiple of key/value heads K=3"):
        attention(q, k, v, impl="xla")


def test_auto_picks_by_backend_and_length():
    assert choose_impl("auto", q_len=16, kv_len=16, backend="cpu") == "xla"
    assert choose_impl("auto", q_len=16, kv_len=16, has_bias=True, backend="gpu") == "xla"
    assert choose_impl("reference", q_len=16, kv_len=16) == "reference"
