"""The attention module against per-head scaled dot-product attention (Vaswani et al. 2017)
with explicit per-head weights."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.attention import MultiHeadAttention


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_module_matches_per_head_loop(num_kv_heads):
    D, N, H, T = 16, 4, 4, 5
    x = np.random.default_rng(0).normal(size=(1, T, D)).astype(np.float32)
    module = MultiHeadAttention(D, N, num_kv_heads, H, attention_bias=False, impl="reference")
    pos = jnp.arange(T)[None]
    params = nn.unbox(module.init(jax.random.key(0), x, q_positions=pos))["params"]
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


def _numpy_cross_attention(p, x, ctx):
    """softmax(Q K^T / sqrt(H)) V per head, queries from ``x`` and keys/values from ``ctx``,
    no mask, with the projections' biases; float64."""
    N, H = p["query"]["kernel"].shape[1:]
    q = np.einsum("td,dnh->nth", x, p["query"]["kernel"]) + p["query"]["bias"][:, None]
    k = np.einsum("sd,dnh->nsh", ctx, p["key"]["kernel"]) + p["key"]["bias"][:, None]
    v = np.einsum("sd,dnh->nsh", ctx, p["value"]["kernel"]) + p["value"]["bias"][:, None]
    e = q @ k.transpose(0, 2, 1) / np.sqrt(H)  # [N, T, S]
    a = np.exp(e - e.max(-1, keepdims=True))
    heads = (a / a.sum(-1, keepdims=True)) @ v  # [N, T, H]
    return np.einsum("nth,nhd->td", heads, p["out"]["kernel"]) + p["out"]["bias"]


def test_cross_attention_uses_context():
    """Cross-attention (queries from x, keys and values from a longer context, no mask)
    matches a NumPy computation from the module's own params, for two different contexts."""
    D, N, H = 8, 2, 4
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 3, D)).astype(np.float32)
    module = MultiHeadAttention(D, N, N, H, impl="reference")
    pos = jnp.arange(3)[None]
    ctx = rng.normal(size=(1, 6, D)).astype(np.float32)
    params = nn.unbox(module.init(jax.random.key(0), x, ctx, q_positions=pos))
    # biases start at zero: move every parameter so that the biases count too
    params = jax.tree.map(lambda a: a + 0.1 * rng.normal(size=a.shape).astype(np.float32), params)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    for context in (ctx, rng.normal(size=(1, 6, D)).astype(np.float32)):
        out, _ = module.apply(params, x, context, q_positions=pos)
        assert out.shape == (1, 3, D)
        expected = _numpy_cross_attention(p, x[0].astype(np.float64), context[0])
        np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)
