"""The mixture-of-experts feed-forward against the dense feed-forward it generalises, a
NumPy transcription of its losses and a reference that loops over tokens one at a time."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.mlp import GATED, FeedForward
from tfmjax.layers.moe import COLLECTION, MoEFeedForward, capacity

B, T, D, F = 2, 6, 8, 12


def moe_params(module, x, seed=0):
    variables = jax.jit(module.init)(jax.random.key(seed), x)
    return {"params": nn.unbox(variables["params"])}


def dense_as_experts(dense: dict, num_experts: int) -> dict:
    """The dense feed-forward's params stacked as ``num_experts`` identical experts."""
    experts = {}
    for name, layer in dense.items():
        experts[name] = jnp.stack([layer["kernel"]] * num_experts)
        if "bias" in layer:
            experts[f"{name}_bias"] = jnp.stack([layer["bias"]] * num_experts)
    return experts


def softmax(z):
    z = z - z.max(-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(-1, keepdims=True)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_one_expert_equals_the_dense_feed_forward(activation, rng):
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    dense = FeedForward(F, activation)
    dense_params = moe_params(dense, x)["params"]
    moe = MoEFeedForward(1, 1, F, activation, capacity_factor=0.0)
    params = moe_params(moe, x)
    params["params"].update(dense_as_experts(dense_params, 1))
    want = dense.apply({"params": dense_params}, x)
    np.testing.assert_allclose(moe.apply(params, x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_identical_experts_with_top_1_equal_the_dense_feed_forward(activation, rng):
    """Renormalised (the one gate is 1): the dense output; Switch's raw gate: the dense output
    times the router's largest probability. Dropless, so no token is dropped."""
    E = 4
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    dense = FeedForward(F, activation)
    dense_params = moe_params(dense, x)["params"]
    want = np.asarray(dense.apply({"params": dense_params}, x))
    for renormalize in (True, False):
        moe = MoEFeedForward(E, 1, F, activation, capacity_factor=0.0, renormalize=renormalize)
        params = moe_params(moe, x, seed=1)
        params["params"].update(dense_as_experts(dense_params, E))
        router = np.asarray(params["params"]["router"]["kernel"])
        p_max = softmax(np.asarray(x) @ router).max(-1, keepdims=True)
        expected = want if renormalize else want * p_max
        np.testing.assert_allclose(moe.apply(params, x), expected, rtol=1e-5, atol=1e-6)


def numpy_expert(params, e, x, activation):
    """Expert ``e`` on one token ``x [D]`` (float64)."""
    p = {k: np.asarray(v, np.float64)[e] for k, v in params.items() if k != "router"}
    act = {"relu": lambda h: np.maximum(h, 0), "swiglu": lambda h: h / (1 + np.exp(-h))}[activation]
    if activation in GATED:
        h = act(x @ p["gate"] + p["gate_bias"]) * (x @ p["up"] + p["up_bias"])
    else:
        h = act(x @ p["up"] + p["up_bias"])
    return h @ p["down"] + p["down_bias"]


def numpy_moe(params, x, mask, E, k, factor, activation, renormalize):
    """Token by token, in order: each real token's top-k experts by router probability, a
    choice kept while its expert has a free slot in this row (the capacity of its real
    tokens). Returns (y, aux, z, dropped)."""
    router = np.asarray(params["router"]["kernel"], np.float64)
    logits = x @ router
    probs = softmax(logits)
    y = np.zeros_like(x)
    counts_f, chosen_n, dropped_n = np.zeros(E), 0, 0
    for b in range(x.shape[0]):
        used = np.zeros(E, int)
        cap = capacity(int(mask[b].sum()), E, k, factor)  # from the row's real tokens
        for t in range(x.shape[1]):
            if not mask[b, t]:
                continue
            top = np.argsort(-probs[b, t], kind="stable")[:k]
            gates = probs[b, t, top]
            gates = gates / gates.sum() if renormalize else gates
            for e, g in zip(top, gates, strict=True):
                counts_f[e] += 1
                chosen_n += 1
                if used[e] < cap:
                    used[e] += 1
                    y[b, t] += g * numpy_expert(params, e, x[b, t], activation)
                else:
                    dropped_n += 1
    n = mask.sum()
    f = counts_f / (n * k)  # Switch: the fraction of choices sent to each expert
    P = (probs * mask[..., None]).sum((0, 1)) / n  # the mean router probability
    lse = np.log(np.exp(logits).sum(-1))
    z = (lse**2 * mask).sum() / n
    return y, E * np.sum(f * P), z, dropped_n / chosen_n


@pytest.mark.parametrize(
    "E,k,factor,activation,renormalize",
    [
        (4, 1, 1.0, "relu", False),  # Switch
        (4, 2, 1.0, "swiglu", True),  # Mixtral-style, capacity 3 of 6 tokens
        (3, 2, 0.5, "relu", True),  # tight: capacity 2
        (4, 2, 0.0, "swiglu", True),  # dropless
    ],
)
def test_outputs_losses_and_drops_match_a_token_by_token_reference(
    E, k, factor, activation, renormalize, rng
):
    x = rng.normal(size=(B, T, D)).astype(np.float32)
    mask = np.ones((B, T), bool)
    mask[1, :2] = False  # left padding takes no slot
    moe = MoEFeedForward(E, k, F, activation, capacity_factor=factor, renormalize=renormalize)
    params = moe_params(moe, x)
    for name in ("up_bias", "down_bias", "gate_bias"):  # non-zero biases show in the output
        if name in params["params"]:
            params["params"][name] = jnp.asarray(rng.normal(size=params["params"][name].shape))
    y, sown = jax.jit(lambda p, x: moe.apply(p, x, mask, mutable=[COLLECTION]))(params, x)
    want_y, aux, z, dropped = numpy_moe(
        params["params"], x.astype(np.float64), mask, E, k, factor, activation, renormalize
    )
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    got = {name: float(value[0]) for name, value in sown[COLLECTION].items()}
    np.testing.assert_allclose(got["aux_loss"], aux, rtol=1e-5)
    np.testing.assert_allclose(got["z_loss"], z, rtol=1e-5)
    np.testing.assert_allclose(got["dropped"], dropped, atol=1e-7)
    if factor == 0:
        assert dropped == 0
    if factor == 0.5:
        assert dropped > 0  # the case tests dropping
    np.testing.assert_array_equal(np.asarray(y)[1, :2], 0.0)  # padding gets nothing


def loop_moe(params, x, mask, routes, factor, renormalize):
    """Plain JAX, one token at a time, for ``jax.grad``: ``routes[b][t]`` are the token's
    experts (chosen outside, they are discrete), gates from the router's softmax."""
    rows = []
    E, k = params["up"].shape[0], len(routes[0][0])
    for b in range(x.shape[0]):
        used, outs = [0] * E, []
        cap = capacity(int(mask[b].sum()), E, k, factor)
        for t in range(x.shape[1]):
            out = jnp.zeros(x.shape[-1])
            if mask[b, t]:
                probs = jax.nn.softmax(x[b, t] @ params["router"]["kernel"])
                gates = probs[jnp.asarray(routes[b][t])]
                gates = gates / jnp.sum(gates) if renormalize else gates
                for j, e in enumerate(routes[b][t]):
                    if used[e] < cap:
                        used[e] += 1
                        h = jax.nn.relu(x[b, t] @ params["up"][e] + params["up_bias"][e])
                        out = out + gates[j] * (h @ params["down"][e] + params["down_bias"][e])
            outs.append(out)
        rows.append(jnp.stack(outs))
    return jnp.stack(rows)


@pytest.mark.parametrize("k,factor,renormalize", [(1, 1.0, False), (2, 0.5, True)])
def test_gradients_match_a_token_by_token_reference(k, factor, renormalize, rng):
    """Gradients of every param and of the input, capacity dropping included."""
    E = 3
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    mask = np.ones((B, T), bool)
    mask[0, -1] = False
    moe = MoEFeedForward(E, k, F, "relu", capacity_factor=factor, renormalize=renormalize)
    params = moe_params(moe, x)["params"]
    probs = softmax(np.asarray(x) @ np.asarray(params["router"]["kernel"]))
    routes = np.argsort(-probs, axis=-1, kind="stable")[..., :k].tolist()
    weights = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)

    def fused(p, x):
        return jnp.sum(moe.apply({"params": p}, x, mask) * weights)

    def reference(p, x):
        return jnp.sum(loop_moe(p, x, mask, routes, factor, renormalize) * weights)

    got = jax.jit(jax.value_and_grad(fused, argnums=(0, 1)))(params, x)
    want = jax.jit(jax.value_and_grad(reference, argnums=(0, 1)))(params, x)
    # The loss and each gradient are sums of signed terms that can cancel (CI once drew a
    # loss of 1.6e-4 from terms near 1): tolerances are relative to the terms' size.
    terms = jnp.abs(loop_moe(params, x, mask, routes, factor, renormalize) * weights)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-6 * float(jnp.sum(terms)))
    got, want = got[1], want[1]
    flat_got, flat_want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(flat_got) == len(flat_want)
    for g, w in zip(flat_got, flat_want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(jnp.abs(w).max()))
    assert float(jnp.abs(got[0]["router"]["kernel"]).max()) > 0  # the router learns


def test_aux_losses_are_one_and_log_e_squared_at_a_uniform_router(rng):
    """Zero router weights: every probability 1/E, so E * sum f_e P_e = sum f_e = 1 and each
    logsumexp is log E (Switch's and ST-MoE's formulas at their balanced point)."""
    E = 4
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    moe = MoEFeedForward(E, 2, F, "relu", renormalize=True)
    params = moe_params(moe, x)
    params["params"]["router"]["kernel"] = jnp.zeros((D, E))
    _, sown = moe.apply(params, x, mutable=[COLLECTION])
    np.testing.assert_allclose(sown[COLLECTION]["aux_loss"][0], 1.0, rtol=1e-6)
    np.testing.assert_allclose(sown[COLLECTION]["z_loss"][0], math.log(E) ** 2, rtol=1e-6)


def test_capacity_formula():
    assert capacity(16, 4, 1, 1.0) == 4
    assert capacity(16, 4, 2, 1.25) == 10  # ceil(1.25 * 16 * 2 / 4)
    assert capacity(10, 8, 1, 1.0) == 2  # ceil(1.25) rounds up
    assert capacity(16, 4, 2, 0.0) == 16  # dropless
    assert capacity(4, 2, 2, 8.0) == 4  # never more slots than tokens
    assert capacity(6, 4, 1, 1.0) == 2 and capacity(4, 4, 1, 1.0) == 1  # ceil(1.5), ceil(1)


def test_bfloat16_compute_follows_float32(rng):
    """The experts compute in bfloat16, the router in float32 (same choices)."""
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    moe = MoEFeedForward(4, 2, F, "swiglu", dtype=jnp.bfloat16)
    params = moe_params(moe, x)
    y = moe.apply(params, x)
    want = MoEFeedForward(4, 2, F, "swiglu").apply(params, x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=0.05, atol=0.05)
