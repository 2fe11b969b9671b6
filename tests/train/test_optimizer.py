"""Weight-decay mask, clipping and gradient accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax.train import optimizer as O
from tfmjax.train.schedules import warmup_constant


def make_params():
    z = jnp.zeros
    return {
        "encoder": {
            "layer_0": {
                "attention": {
                    "query": {"kernel": z((8, 2, 4)), "bias": z((2, 4))},
                    "out": {"kernel": z((2, 4, 8))},
                    "rel_bias": {"embedding": z((32, 2))},
                },
                "pre_attention_norm": {"scale": z((8,))},
                "mlp": {
                    "wi": {"kernel": z((8, 16)), "bias": z((16,))},
                    "wo": {"kernel": z((16, 8))},
                },
                "LayerNorm_0": {"scale": z((8,)), "bias": z((8,))},
            },
        },
        "token_embed": {"embedding": z((100, 8))},
        "pos_embedding": z((1, 64, 8)),
        "lm_head": {"kernel": z((8, 100))},
        "layers": [{"kernel": z((8, 8))}, {"gain": z((8,))}],
    }


def test_weight_decay_mask():
    m = O.weight_decay_mask(make_params())
    layer = m["encoder"]["layer_0"]
    assert layer["attention"]["query"] == {"kernel": True, "bias": False}
    assert layer["attention"]["out"]["kernel"] is True
    assert layer["attention"]["rel_bias"]["embedding"] is False
    assert layer["pre_attention_norm"]["scale"] is False
    assert layer["mlp"] == {"wi": {"kernel": True, "bias": False}, "wo": {"kernel": True}}
    assert layer["LayerNorm_0"] == {"scale": False, "bias": False}
    assert m["token_embed"]["embedding"] is False
    assert m["pos_embedding"] is False
    assert m["lm_head"]["kernel"] is True
    assert m["layers"] == [{"kernel": True}, {"gain": False}]  # a vector never decays
    assert jax.tree.structure(m) == jax.tree.structure(make_params())


def test_weight_decay_applies_only_to_masked_in_leaves():
    params = jax.tree.map(jnp.ones_like, make_params())
    tx = O.make_optimizer(schedule=0.1, weight_decay=0.5, clip_norm=None)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    mask = O.weight_decay_mask(params)
    for u, decays in zip(jax.tree.leaves(updates), jax.tree.leaves(mask), strict=True):
        np.testing.assert_allclose(u, -0.1 * 0.5 if decays else 0.0, rtol=1e-6)


def _run(tx, params, grads):
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(g, state, params)
    return updates


def test_clipping_bounds_update():
    """After a history of small gradients, a huge one acts as if rescaled to clip_norm."""
    params = {"w": jnp.zeros((4, 4)), "b": jnp.zeros((4,))}
    small = jax.tree.map(lambda p: jnp.full(p.shape, 0.1), params)  # norm 0.2 < clip
    huge = {"w": jnp.full((4, 4), 1e6), "b": jnp.full((4,), -1e6)}
    huge_norm = float(optax.tree.norm(huge))
    rescaled = jax.tree.map(lambda g: g / huge_norm, huge)  # norm exactly 1
    lr = 1e-2
    clipped = _run(O.make_optimizer(schedule=lr, clip_norm=1.0), params, [small] * 3 + [huge])
    manual = _run(O.make_optimizer(schedule=lr, clip_norm=None), params, [small] * 3 + [rescaled])
    raw = _run(O.make_optimizer(schedule=lr, clip_norm=None), params, [small] * 3 + [huge])
    for a, b in zip(jax.tree.leaves(clipped), jax.tree.leaves(manual), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert not np.allclose(jax.tree.leaves(clipped)[0], jax.tree.leaves(raw)[0], rtol=1e-2)
    n = sum(p.size for p in jax.tree.leaves(params))
    assert float(optax.tree.norm(clipped)) <= 2 * lr * np.sqrt(n)


def test_clipping_changes_adam_moments():
    """Clipping happens before Adam: the first moment holds the clipped gradient."""
    params = {"w": jnp.zeros((3,))}
    grads = {"w": jnp.array([3e3, 4e3, 0.0])}  # norm 5000
    tx = O.make_optimizer(schedule=1e-3, clip_norm=1.0, b1=0.9)
    _, state = tx.update(grads, tx.init(params), params)
    mu = optax.tree.get(state, "mu")["w"]
    np.testing.assert_allclose(mu, 0.1 * np.array([0.6, 0.8, 0.0]), rtol=1e-5)
    tx = O.make_optimizer(schedule=1e-3, clip_norm=None, b1=0.9)
    _, state = tx.update(grads, tx.init(params), params)
    mu = optax.tree.get(state, "mu")["w"]
    np.testing.assert_allclose(mu, 0.1 * np.array([3e3, 4e3, 0.0]), rtol=1e-5)


def test_current_learning_rate():
    sched = warmup_constant(1.0, 4)
    assert float(O.current_learning_rate(sched, 2)) == 0.5
    assert float(jax.jit(O.current_learning_rate, static_argnums=0)(sched, jnp.int32(8))) == 1.0
    assert float(O.current_learning_rate(3e-4, 10)) == pytest.approx(3e-4)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(weight_decay=-0.1), "weight_decay must be a finite number in"),
        (dict(b1=1.0), r"b1 must be a finite number in \[0.0, 1.0\), got 1.0"),
        (dict(b2=-0.5), "b2 must"),
        (dict(eps=0.0), r"eps must be a finite number in \(0.0, inf\), got 0.0"),
        (dict(clip_norm=0.0), "clip_norm must"),
        (dict(schedule="cosine"), "schedule must be a float or an optax.Schedule"),
    ],
)
def test_make_optimizer_errors(kw, msg):
    kw = {"schedule": 1e-3, **kw}
    with pytest.raises(ValueError, match=msg) as e:
        O.make_optimizer(**kw)
    assert "\n" not in str(e.value)
