"""Every layer against a small NumPy implementation of the papers' formulas."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels.masks import alibi_bias
from tfmjax.layers.mlp import FeedForward
from tfmjax.layers.norms import LayerNorm, RMSNorm, make_norm
from tfmjax.layers.positions import alibi_slopes, apply_rope, relative_bucket, sinusoidal


def test_layernorm_matches_seed_formula(rng):
    # LayerNorm (Ba et al. 2016): gamma * (x - mu) / sqrt(sigma^2 + eps) + beta
    x = rng.normal(size=(2, 3, 8)).astype(np.float32) * 3 + 1
    gamma = rng.normal(size=8).astype(np.float32)
    beta = rng.normal(size=8).astype(np.float32)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    expected = gamma * (x - mu) / np.sqrt(var + 1e-5) + beta
    got = LayerNorm(eps=1e-5).apply({"params": {"scale": gamma, "bias": beta}}, x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_rmsnorm_matches_formula(rng):
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    gamma = rng.normal(size=8).astype(np.float32)
    expected = gamma * x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    got = RMSNorm(eps=1e-6).apply({"params": {"scale": gamma}}, x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_norm_eps_is_added_to_the_variance(kind, rng):
    """With unit-variance rows and eps = 0.5 the eps term is a third of the denominator,
    so adding it anywhere else (or subtracting it) shows."""
    x = rng.normal(size=(3, 16)).astype(np.float32)
    x = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)  # mean 0, variance 1
    module = make_norm(kind, eps=0.5)
    params = nn.unbox(module.init(jax.random.key(0), x))
    np.testing.assert_allclose(module.apply(params, x), x / np.sqrt(1.5), rtol=1e-5, atol=1e-6)


def test_make_norm_builds_the_named_norm():
    """``make_norm`` maps each name to its class with the given eps and name; others fail."""
    for kind, cls in [("layernorm", LayerNorm), ("rmsnorm", RMSNorm)]:
        module = make_norm(kind, eps=0.25, name="ln")
        assert type(module) is cls and module.eps == 0.25 and module.name == "ln"
    with pytest.raises(ValueError, match="norm='batchnorm' is not one of layernorm, rmsnorm"):
        make_norm("batchnorm", eps=1e-5)


def numpy_sinusoidal(n, d):
    # Sinusoidal encoding (Vaswani et al. 2017, section 3.5), loop for loop.
    pe = np.zeros((n, d))
    for pos in range(n):
        for i in range(d // 2):
            w = 1 / 10000 ** (2 * i / d)
            pe[pos, 2 * i] = math.sin(pos * w)
            pe[pos, 2 * i + 1] = math.cos(pos * w)
    return pe


def test_sinusoidal_matches_algorithm_5_7():
    np.testing.assert_allclose(sinusoidal(jnp.arange(50), 16), numpy_sinusoidal(50, 16), atol=2e-5)


def test_sinusoidal_shift_is_a_fixed_linear_map():
    # Vaswani et al. 2017: PE(pos + k) = M_k PE(pos), M_k block-diagonal 2x2 rotations by k*w_i,
    # the same matrix for every position.
    d, k = 16, 7
    omega = 1 / 10000 ** (2 * np.arange(d // 2) / d)
    m_k = np.zeros((d, d))
    for i, w in enumerate(omega):
        m_k[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [
            [np.cos(k * w), np.sin(k * w)],
            [-np.sin(k * w), np.cos(k * w)],
        ]
    pe = np.asarray(sinusoidal(jnp.arange(80), d), np.float64)
    np.testing.assert_allclose(pe[:-k] @ m_k.T, pe[k:], atol=1e-4)
    m_wrong = np.eye(d)
    assert np.abs(pe[:-k] @ m_wrong - pe[k:]).max() > 0.1  # the shift is not trivial


def numpy_rope(x, positions, base=10000.0):
    # RoPE (Su et al. 2021), pairs (2i, 2i+1), with d = head width.
    out = np.array(x, np.float64)
    d = x.shape[-1]
    for pos_index, pos in enumerate(positions):
        for i in range(d // 2):
            theta = base ** (-2 * i / d)
            c, s = math.cos(pos * theta), math.sin(pos * theta)
            x0, x1 = x[pos_index, ..., 2 * i], x[pos_index, ..., 2 * i + 1]
            out[pos_index, ..., 2 * i] = x0 * c - x1 * s
            out[pos_index, ..., 2 * i + 1] = x0 * s + x1 * c
    return out


def test_rope_matches_algorithm_5_7(rng):
    x = rng.normal(size=(6, 2, 8)).astype(np.float32)  # [T, N, H]
    positions = np.array([0, 1, 2, 5, 9, 100])
    got = apply_rope(jnp.asarray(x)[None], jnp.asarray(positions)[None])[0]
    np.testing.assert_allclose(got, numpy_rope(x, positions), rtol=1e-4, atol=1e-4)


def test_rope_dot_product_depends_only_on_offset(rng):
    # RoPE (Su et al. 2021): (R_m q)^T (R_n k) = q^T R_{n-m} k.
    q = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)
    score = lambda m, n: float(
        jnp.sum(apply_rope(q, jnp.array([[m]])) * apply_rope(k, jnp.array([[n]])))
    )
    for m, n in [(0, 3), (10, 13), (57, 60)]:
        assert score(m, n) == pytest.approx(score(0, 3), abs=1e-4)
    assert abs(score(0, 3) - score(0, 4)) > 1e-3  # and does depend on it


def test_alibi_slopes_and_bias():
    # ALiBi (Press et al. 2022): m_h = 2^(-8h/H), bias = -m |i - j|.
    slopes = np.asarray(alibi_slopes(8))
    np.testing.assert_allclose(slopes, [2 ** (-8 * h / 8) for h in range(1, 9)], rtol=1e-6)
    np.testing.assert_allclose(slopes[:3], [0.5, 0.25, 0.125])
    bias = np.asarray(alibi_bias(jnp.asarray(slopes), jnp.arange(4), jnp.arange(5)))
    i, j = np.meshgrid(np.arange(4), np.arange(5), indexing="ij")
    np.testing.assert_allclose(bias, -slopes[:, None, None] * np.abs(i - j)[None], rtol=1e-6)


def test_relative_buckets_exact_near_and_log_spaced_far():
    rel = jnp.arange(-200, 201)
    b = np.asarray(relative_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128))
    assert b.min() >= 0 and b.max() < 32
    near = {int(r): int(x) for r, x in zip(rel, b, strict=True) if abs(int(r)) < 8}
    assert len(set(near.values())) == len(near)  # exact small offsets
    assert b[rel == 150][0] == b[rel == 200][0]  # far ones share buckets
    causal = np.asarray(relative_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128))
    assert (causal[rel > 0] == 0).all()  # future keys: bucket 0


def _ffn_numpy(x, p, activation):
    dense = lambda name, h: h @ p[name]["kernel"] + p[name]["bias"]
    gelu = lambda h: h * 0.5 * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))  # x Phi(x)
    # GPT-2's tanh approximation of GELU (Hendrycks & Gimpel 2016)
    gelu_tanh = lambda h: 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    swish = lambda h: h / (1 + np.exp(-h))  # x sigmoid(x)
    plain = {"relu": lambda h: np.maximum(h, 0), "gelu": gelu, "gelu_tanh": gelu_tanh}
    plain["silu"] = swish
    gated = {"swiglu": swish, "geglu": gelu, "geglu_tanh": gelu_tanh}
    if activation in plain:
        h = plain[activation](dense("up", x))
    else:
        h = gated[activation](dense("gate", x)) * dense("up", x)
    return dense("down", h)


@pytest.mark.parametrize(
    "activation", ["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh"]
)
def test_feed_forward_matches_seed_formulas(activation, rng):
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    module = FeedForward(d_ff=12, activation=activation)
    params = nn.unbox(module.init(jax.random.key(0), x))["params"]
    params = jax.tree.map(lambda p: p + 0.1 * rng.normal(size=p.shape).astype(np.float32), params)
    expected = _ffn_numpy(x.astype(np.float64), jax.tree.map(np.asarray, params), activation)
    np.testing.assert_allclose(module.apply({"params": params}, x), expected, rtol=1e-4, atol=1e-5)
    assert ("gate" in params) == (activation in ("swiglu", "geglu", "geglu_tanh"))
    # ``expected`` uses the module's own weights, so check their shapes independently:
    # D -> d_ff -> D, whatever the sequence length.
    assert params["up"]["kernel"].shape == (8, 12) and params["down"]["kernel"].shape == (12, 8)


def test_feed_forward_dropout_is_off_unless_asked(rng):
    """No dropout by default (rate 0), and a dropout rate acts only when ``deterministic``
    is turned off: the module is deterministic unless the caller says otherwise."""
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    plain = FeedForward(d_ff=32)
    params = nn.unbox(plain.init(jax.random.key(0), x))
    rngs = {"dropout": jax.random.key(1)}
    want = plain.apply(params, x)
    np.testing.assert_array_equal(plain.apply(params, x, deterministic=False, rngs=rngs), want)
    dropping = FeedForward(d_ff=32, dropout_rate=0.5)
    np.testing.assert_array_equal(dropping.apply(params, x), want)
    assert not np.allclose(dropping.apply(params, x, deterministic=False, rngs=rngs), want)


def test_unknown_activation_is_one_line():
    with pytest.raises(ValueError, match="activation='swish' is not one of"):
        FeedForward(d_ff=4, activation="swish").init(jax.random.key(0), jnp.ones((1, 1, 2)))
