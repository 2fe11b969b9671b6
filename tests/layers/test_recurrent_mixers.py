"""The recurrent self-mixers as layers (tfmjax.layers.retention, tfmjax.layers.selective_scan,
tfmjax.layers.rwkv): the uncached forward (the training form: retention's parallel form, the
associative scans) equals the cached path (retention's chunkwise form, the scan from a carried
state, rwkv's recurrence) fed in pieces, in values, and in gradients with respect to every
parameter. rwkv's time-mix and channel-mix are also checked against a float64 NumPy loop of
the paper's equations (token shift, eq. 11-20).

Tolerance: max abs error at most ``RTOL = 2e-5`` of the largest magnitude for values,
``GTOL = 1e-4`` for parameter gradients (float32, two summation orders).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.attention_variants import ATTENTION_VARIANTS
from tfmjax.layers.block_config import BlockConfig

RTOL, GTOL = 2e-5, 1e-4
B, T, D = 2, 7, 16
CASES = {
    "retention": BlockConfig(d_model=D, num_heads=2, num_kv_heads=2, head_dim=8, d_ff=32),
    "retention_rope": BlockConfig(
        d_model=D, num_heads=2, num_kv_heads=2, head_dim=8, d_ff=32, rope_base=100.0
    ),
    "selective_scan": BlockConfig(
        d_model=D, num_heads=2, num_kv_heads=2, head_dim=8, d_ff=32, ssm_state=4, ssm_conv=3
    ),
    "rwkv": BlockConfig(d_model=D, num_heads=2, num_kv_heads=2, head_dim=8, d_ff=32),
}
MIXERS = ["retention", "selective_scan", "rwkv"]


def _module(case):
    name = "retention" if case.startswith("retention") else case
    c = CASES[case]._replace(attention=name)
    module = ATTENTION_VARIANTS[name].from_block_config(c, "attention")
    if name == "retention":
        module = module.clone(chunk_size=3)  # a whole chunk and a remainder
    return ATTENTION_VARIANTS[name], c, module


def assert_rel(got, want, tol, name):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
    assert err <= tol * scale, f"{name}: max abs error {err:.2e} > {tol} x {scale:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_cached_pieces_equal_the_uncached_forward_in_values_and_gradients(case):
    variant, c, module = _module(case)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((B, T, D), np.float32))
    d_out = jnp.asarray(rng.standard_normal((B, T, D), np.float32))
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    params = jax.jit(module.init, static_argnames="causal")(
        jax.random.key(0), x, q_positions=positions, causal=True
    )

    def uncached(params):
        return module.apply(params, x, q_positions=positions, causal=True)[0]

    def cached(params):  # a prompt of 4 in one call, one token, then two
        cache, outs = variant.init_cache(c, B, T), []
        for lo, hi in [(0, 4), (4, 5), (5, 7)]:
            out, cache = module.apply(
                params, x[:, lo:hi], q_positions=positions[:, lo:hi], causal=True, cache=cache
            )
            outs.append(out)
        return jnp.concatenate(outs, axis=1)

    def value_and_grad(f):
        loss = lambda p: (jnp.sum(f(p) * d_out), f(p))  # noqa: E731
        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (_, want), g_want = value_and_grad(uncached)
    (_, got), g_got = value_and_grad(cached)
    assert_rel(got, want, RTOL, "out")
    paths = jax.tree_util.tree_flatten_with_path(g_want)[0]
    for (path, w), g in zip(paths, jax.tree.leaves(g_got), strict=True):
        assert np.any(np.asarray(w) != 0), f"no gradient reaches {path}"
        assert_rel(g, w, GTOL, jax.tree_util.keystr(path))


@pytest.mark.parametrize("name", MIXERS)
def test_refuses_a_non_causal_use_and_cross_attention(name):
    variant, c, module = _module(name)
    x, positions = jnp.ones((1, 3, D)), jnp.zeros((1, 3), jnp.int32)
    with pytest.raises(ValueError, match="causal only"):
        module.init(jax.random.key(0), x, q_positions=positions)
    with pytest.raises(ValueError, match="without score biases"):
        module.init(jax.random.key(0), x, x, q_positions=positions, causal=True)


@pytest.mark.parametrize("name", MIXERS)
def test_left_padding_leaves_the_state_as_if_the_row_started_later(name):
    """Decoding left-pads prompts: padded tokens (segment id 0) enter neither the
    retention state nor the scan and convolution states."""
    variant, c, module = _module(name)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((1, 6, D), np.float32))
    positions = jnp.zeros((1, 6), jnp.int32)
    params = jax.jit(module.init, static_argnames="causal")(
        jax.random.key(0), x, q_positions=positions, causal=True
    )
    padded = jnp.concatenate([jnp.asarray(rng.standard_normal((1, 3, D), np.float32)), x], 1)
    seg = jnp.asarray([[0, 0, 0] + [1] * 6])
    kw = dict(causal=True)
    apply = jax.jit(module.apply, static_argnames="causal")
    plain, s1 = apply(params, x, q_positions=positions, cache=variant.init_cache(c, 1, 6), **kw)
    out, s2 = apply(
        params,
        padded,
        q_positions=jnp.pad(positions, ((0, 0), (3, 0))),
        q_segment_ids=seg,
        cache=variant.init_cache(c, 1, 9),
        **kw,
    )
    assert_rel(out[:, 3:], plain, RTOL, f"{name} out")
    for key in s1:
        if key != "index":
            assert_rel(s2[key], s1[key], RTOL, f"{name} {key}")


def test_cache_bytes_follow_the_formula_in_both_dtypes():
    for dtype in (jnp.float32, jnp.bfloat16):
        for name in MIXERS:
            variant, c, _ = _module(name)
            c = c._replace(dtype=dtype)
            cache = variant.init_cache(c, 3, 100)
            arrays = [a for k, a in cache.items() if k != "index"]
            assert sum(a.nbytes for a in arrays) == variant.cache_bytes(c, 3, 1, 100)
            assert variant.cache_bytes(c, 3, 2, 100) == variant.cache_bytes(c, 3, 2, 10**6)
    _, c, _ = _module("retention")
    assert ATTENTION_VARIANTS["retention"].cache_bytes(c, 1, 1, 0) == 2 * 8 * 8 * 4  # N H H f32
    _, c, _ = _module("selective_scan")  # E = 32, P = 4, W = 3: h float32 + 2 conv inputs
    assert ATTENTION_VARIANTS["selective_scan"].cache_bytes(c, 1, 1, 0) == 32 * (4 * 4 + 2 * 4)
    _, c, _ = _module("rwkv")  # a, b, p float32 + the two shifted inputs [D], float32
    assert ATTENTION_VARIANTS["rwkv"].cache_bytes(c, 1, 1, 0) == D * (3 * 4 + 2 * 4)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _shift_lerp(x, mu):
    """``mu * x_t + (1 - mu) * x_{t-1}``, ``x_{-1} = 0`` (float64)."""
    prev = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], 1)
    return mu * x + (1 - mu) * prev


def _numpy_time_mix(p, x):
    """Eq. 11-17 as a loop over time: ``W_o (sigmoid(r_t) * wkv_t)``, ``wkv_t`` the paper's
    sums over ``i <= t`` (float64)."""
    lin = lambda name, y: y @ p[name]["kernel"]  # noqa: E731
    r = lin("receptance", _shift_lerp(x, p["time_mix_r"]))
    k = lin("key", _shift_lerp(x, p["time_mix_k"]))
    v = lin("value", _shift_lerp(x, p["time_mix_v"]))
    w, u = np.exp(p["time_decay"]), p["time_first"]
    wkv = np.zeros_like(v)
    for t in range(x.shape[1]):
        num, den = np.exp(u + k[:, t]) * v[:, t], np.exp(u + k[:, t])
        for i in range(t):
            e = np.exp(-(t - 1 - i) * w + k[:, i])
            num, den = num + e * v[:, i], den + e
        wkv[:, t] = num / den
    return lin("output", _sigmoid(r) * wkv)


def _numpy_channel_mix(p, x):
    """Eq. 18-20: ``sigmoid(W_r x'_r) * W_v relu(W_k x'_k)^2`` (float64)."""
    lin = lambda name, y: y @ p[name]["kernel"]  # noqa: E731
    hidden = np.maximum(lin("key", _shift_lerp(x, p["time_mix_k"])), 0) ** 2
    return _sigmoid(lin("receptance", _shift_lerp(x, p["time_mix_r"]))) * lin("value", hidden)


def test_rwkv_time_mix_and_channel_mix_follow_the_papers_equations():
    """Random (not initial) parameters, biases off as in the paper."""
    from tfmjax.layers.rwkv import RWKVChannelMix

    c = CASES["rwkv"]._replace(attention="rwkv", attention_bias=False, mlp_bias=False)
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((B, T, D), np.float32))
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    for module, numpy_form, kw in [
        (ATTENTION_VARIANTS["rwkv"].from_block_config(c, "attention"), _numpy_time_mix, {}),
        (RWKVChannelMix.from_block_config(c, "mlp"), _numpy_channel_mix, None),
    ]:
        kw = dict(q_positions=positions, causal=True) if kw is not None else {}
        params = nn.unbox(module.init(jax.random.key(0), x, **kw))
        params = jax.tree.map(  # away from the init's structure (mu in [0, 1], not ordered)
            lambda a: a + 0.3 * jnp.asarray(rng.standard_normal(a.shape), a.dtype), params
        )
        got = jax.jit(lambda p, x, m=module, kw=kw: m.apply(p, x, **kw)[0])(params, x)
        p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
        assert_rel(got, numpy_form(p64, np.asarray(x, np.float64)), RTOL, module.name)
