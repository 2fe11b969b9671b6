"""Multi-head latent attention: the module against a NumPy reference written from the
DeepSeek-V2 formulas, and its absorbed decoding form against its training form (values and
gradients)."""

import importlib.util
import math
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.latent_attention import LatentAttention, init_latent_cache

_spec = importlib.util.spec_from_file_location(
    "tfmjax_tests_oracle", pathlib.Path(__file__).resolve().parents[1] / "oracle.py"
)
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)
oracle_attention, oracle_rope = oracle.oracle_attention, oracle.oracle_rope

B, T, D, N, H = 2, 7, 32, 4, 8


def make(q_rank=12, rope_dim=4, **kw):
    return LatentAttention(D, N, H, kv_rank=10, q_rank=q_rank, rope_dim=rope_dim, **kw)


def setup_module_params(layer, seed=0):
    x = jax.random.normal(jax.random.key(seed), (B, T, D))
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    params = nn.unbox(layer.init(jax.random.key(1), x, q_positions=positions))
    # random (not zero) biases, so the reference checks where they enter
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: (
            0.1 * jax.random.normal(jax.random.key(len(str(path))), p.shape)
            if "bias" in jax.tree_util.keystr(path)
            else p
        ),
        params,
    )
    return x, positions, params


def rms(x, scale, eps=1e-6):
    return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps) * scale


def reference(params, x, positions, *, R, rope_dim, q_rank, causal=True):
    """MLA from the formulas, float64: c = RMSNorm(x W_dkv), k = [c W_uk ; RoPE(x W_kr)],
    v = c W_uv, q = [q_nope ; RoPE(q_rope)] from RMSNorm(x W_dq) W_uq, softmax attention."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    x = np.asarray(x, np.float64)
    ckr = x @ p["kv_down"]["kernel"] + p["kv_down"]["bias"]
    c = rms(ckr[..., :R], p["kv_norm"]["scale"])
    k_rope = oracle_rope(ckr[..., R:][:, :, None], positions)  # [B,T,1,Hr]
    k_nope = np.einsum("btr,rnh->btnh", c, p["key_up"])
    v = np.einsum("btr,rnh->btnh", c, p["value_up"])
    k = np.concatenate([k_nope, np.repeat(k_rope, N, axis=2)], -1)
    if q_rank is None:
        q = np.einsum("btd,dnh->btnh", x, p["query"]["kernel"]) + p["query"]["bias"]
    else:
        cq = rms(x @ p["q_down"]["kernel"] + p["q_down"]["bias"], p["q_norm"]["scale"])
        q = np.einsum("btr,rnh->btnh", cq, p["q_up"]["kernel"])
    q = np.concatenate([q[..., : H - rope_dim], oracle_rope(q[..., H - rope_dim :], positions)], -1)
    z = oracle_attention(q, k, v, causal=causal, scale=1 / math.sqrt(H))
    return np.einsum("btnh,nhd->btd", z, p["out"]["kernel"]) + p["out"]["bias"]


@pytest.mark.parametrize("q_rank", [12, None])
def test_training_form_matches_the_formulas(q_rank):
    layer = make(q_rank=q_rank)
    x, positions, params = setup_module_params(layer)
    out, cache = layer.apply(params, x, q_positions=positions, causal=True)
    assert cache is None
    ref = reference(params, x, positions, R=10, rope_dim=4, q_rank=q_rank)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)


def absorbed(layer, params, x, positions, pieces=(3, 1, 3)):
    """The decoding form: an empty latent cache fed ``x`` in pieces (prefill, then steps)."""
    cache = init_latent_cache(B, T, layer.kv_rank, layer.rope_dim)
    outs, start = [], 0
    for n in pieces:
        sl = slice(start, start + n)
        out, cache = layer.apply(
            params,
            x[:, sl],
            q_positions=positions[:, sl],
            q_segment_ids=jnp.ones((B, n), jnp.int32),
            causal=True,
            cache=cache,
        )
        outs.append(out)
        start += n
    return jnp.concatenate(outs, 1), cache


@pytest.mark.parametrize("rope_dim", [4, 0])
def test_absorbed_decoding_equals_the_training_form(rope_dim):
    """Values: the cache holds only [c ; k_rope] and the queries move into the latent."""
    layer = make(rope_dim=rope_dim)
    x, positions, params = setup_module_params(layer)
    full, _ = layer.apply(params, x, q_positions=positions, causal=True)
    out, cache = jax.jit(lambda p, x: absorbed(layer, p, x, positions))(params, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(full), rtol=1e-5, atol=1e-5)
    assert cache["k"].shape == (B, 1, T, 10 + rope_dim) and int(cache["index"]) == T


def test_absorbed_gradients_equal_the_training_form():
    layer = make()
    x, positions, params = setup_module_params(layer)
    w = jax.random.normal(jax.random.key(5), (B, T, D))

    def loss_full(p, x):
        return jnp.sum(w * layer.apply(p, x, q_positions=positions, causal=True)[0])

    def loss_absorbed(p, x):
        return jnp.sum(w * absorbed(layer, p, x, positions)[0])

    g_full = jax.jit(jax.grad(loss_full, argnums=(0, 1)))(params, x)
    g_abs = jax.jit(jax.grad(loss_absorbed, argnums=(0, 1)))(params, x)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_abs), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_cross_attention_is_refused():
    layer = make()
    x, positions, params = setup_module_params(layer)
    with pytest.raises(ValueError, match="self-attention only"):
        layer.apply(params, x, x, q_positions=positions)
