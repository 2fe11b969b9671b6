"""Reversible residual layers (``model.reversible``): the recomputing backward pass against
plain autodiff through the same layers (gradients wrt parameters and inputs, with dropout
and LSH or softmax attention: float32, atol 2e-5 relative to gradients of order 0.1-1); the
inverse reconstructs a layer's inputs; the combinations that cannot work are refused in one
line; the preset builds, trains a few steps and decodes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import config as C
from tfmjax.decode import Greedy, generate, generate_uncached
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.blocks import BlockInputs
from tfmjax.layers.reversible import ReversibleBlock, ReversibleStack
from tfmjax.models import build, preset

B, T, D = 2, 9, 16
CFG = BlockConfig(d_model=D, num_heads=2, num_kv_heads=2, head_dim=8, d_ff=32, dropout_rate=0.1)


def _stack(attention: str, recompute: bool):
    cfg = CFG._replace(attention=attention, lsh_buckets=4, lsh_chunk=4)
    kwargs = {"cfg": cfg, "deterministic": False, "causal": True}
    return ReversibleStack(kwargs, 3, recompute=recompute)


def _inputs():
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    return x, BlockInputs(positions, jnp.ones((B, T), jnp.int32))


@pytest.mark.parametrize("attention", ["lsh", "softmax"])
def test_recomputed_gradients_equal_plain_autodiff(attention):
    x, inputs = _inputs()
    params = _stack(attention, True).init(jax.random.key(0), x, None, inputs)
    cot = jax.random.normal(jax.random.key(2), x.shape)
    rngs = {"dropout": jax.random.key(7)}

    def loss(recompute):
        stack = _stack(attention, recompute)
        return lambda p, x: jnp.sum(stack.apply(p, x, None, inputs, rngs=rngs)[0] * cot)

    (v1, g1), (v2, g2) = (
        jax.jit(jax.value_and_grad(loss(r), argnums=(0, 1)))(params, x) for r in (True, False)
    )
    np.testing.assert_allclose(v1, v2, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g1)) > 0.1


def test_the_inverse_reconstructs_the_inputs():
    """``x2 = y2 - G(y1)``, ``x1 = y1 - F(x2)`` with the layer's own dropout keys."""
    x, inputs = _inputs()
    block = ReversibleBlock(CFG, deterministic=False, causal=True)
    params = block.init(jax.random.key(0), x, inputs, part="f")
    params = {
        "params": {
            **params["params"],
            **block.init(jax.random.key(0), x, inputs, part="g")["params"],
        }
    }
    kf, kg = {"dropout": jax.random.key(3)}, {"dropout": jax.random.key(4)}
    F = lambda h: block.apply(params, h, inputs, part="f", rngs=kf)[0]  # noqa: E731
    G = lambda h: block.apply(params, h, inputs, part="g", rngs=kg)[0]  # noqa: E731
    x1, x2 = x, jax.random.normal(jax.random.key(5), x.shape)
    y1 = x1 + F(x2)
    y2 = x2 + G(y1)
    back2 = y2 - G(y1)
    np.testing.assert_allclose(back2, x2, atol=1e-5)
    np.testing.assert_allclose(y1 - F(back2), x1, atol=1e-5)


REFUSED = [
    ({"scan_layers": True}, "model.scan_layers=True is invalid: reversible layers run"),
    ({"norm_position": "post"}, "model.norm_position='post' is invalid: reversible layers need"),
    ({"remat": True}, "model.remat=True is invalid: reversible layers already"),
    ({"moe_experts": 4}, "model.moe_experts=4 is invalid: reversible layers recompute"),
    ({"family": "encoder_decoder"}, "model.family='encoder_decoder' is invalid: reversible"),
    (
        {"attention": "rwkv", "activation": "relu", "position": "none"},
        "model.attention='rwkv' is invalid: reversible layers pair",
    ),
]


@pytest.mark.parametrize("fields,message", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_what_cannot_be_reversible_is_refused_in_one_line(fields, message):
    base = dict(family="decoder_only", reversible=True, scan_layers=False)
    with pytest.raises(C.ConfigError, match=message) as err:
        C.ModelConfig(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_the_preset_trains_and_decodes():
    """tiny-reformer, shrunk: a few SGD steps lower the loss on one batch; greedy generate
    through the reversible layers' LSH caches equals the uncached greedy decode (the chunk
    covers max_len, so the cached form is the training one)."""
    cfg = preset("tiny-reformer", d_model=32, d_ff=64, max_len=32, lsh_chunk=32, lsh_buckets=4)
    model = build(cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 32, (4, 12)), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), {"tokens": tokens})

    def loss(p):
        logp = jax.nn.log_softmax(model.apply(p, {"tokens": tokens}))
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], -1))

    step = jax.jit(lambda p: jax.tree.map(lambda a, g: a - 0.5 * g, p, jax.grad(loss)(p)))
    first = float(loss(params))
    for _ in range(5):
        params = step(params)
    assert float(loss(params)) < first
    prompts = [[int(t) for t in row] for row in np.asarray(tokens[:2, :5])]
    cached = generate(model, params, prompts, Greedy(), 4, eos_id=None)
    uncached = generate_uncached(model, params, prompts, 4, eos_id=None)
    np.testing.assert_array_equal(cached.tokens, uncached.tokens)
