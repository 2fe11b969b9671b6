"""The attention module against per-head scaled dot-product attention (Vaswani et al. 2017)
with explicit per-head weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.attention import MultiHeadAttention


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_module_matches_per_head_loop(num_kv_heads):
    D, N, H, T = 16, 4, 4, 5
    x = np.random.default_rng(0).normal(size=(1, T, D)).astype(np.float32)
    module = MultiHeadAttention(D, N, num_kv_heads, H, use_bias=False, impl="reference")
    pos = jnp.arange(T)[None]
    params = module.init(jax.random.key(0), x, q_positions=pos)["params"]
    out, _ = module.apply({"params": params}, x, q_positions=pos, causal=True)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    heads = []
    for i in range(N):  # FOR i = 1 TO h
        j = i // (N // num_kv_heads)  # the key/value head this query head shares
        q_i = x[0] @ p["query"]["kernel"][:, i]
        k_i = x[0] @ p["key"]["kernel"][:, j]
        v_i = x[0] @ p["value"]["kernel"][:, j]
        e = q_i @ k_i.T / np.sqrt(H)
        e[np.triu_indices(T, 1)] = -np.inf  # causal mask M[i,j] = 1 iff j <= i
        a = np.exp(e - e.max(-1, keepdims=True))
        heads.append((a / a.sum(-1, keepdims=True)) @ v_i)
    z = np.concatenate(heads, -1) @ p["out"]["kernel"].reshape(N * H, D)
    np.testing.assert_allclose(out[0], z, rtol=1e-4, atol=1e-5)
    assert params["key"]["kernel"].shape == (D, num_kv_heads, H)  # K/V heads only


def test_cross_attention_uses_context():
    D, N, H = 8, 2, 4
    x = jnp.ones((1, 3, D))
    ctx = jax.random.normal(jax.random.key(1), (1, 6, D))
    module = MultiHeadAttention(D, N, N, H)
    pos = jnp.arange(3)[None]
    params = module.init(jax.random.key(0), x, ctx, q_positions=pos)
    a, _ = module.apply(params, x, ctx, q_positions=pos)
    b, _ = module.apply(params, x, ctx * 2, q_positions=pos)
    assert a.shape == (1, 3, D) and not np.allclose(a, b)
