"""Hook points of rwkv (``model.attention = "rwkv"``, tfmjax.layers.rwkv): every one is listed
with its documented shape; the recorded values are the model's computation (the time-mix's
output recomputed from ``hook_rwkv_r``, ``hook_wkv`` and ``W_o``; ``hook_wkv`` from
``hook_rwkv_k``, ``hook_rwkv_v`` and the decay by a float64 loop of the paper's sums; the
channel-mix's hidden layer from ``hook_pre``); an edit of ``hook_wkv`` reaches the logits; the
hooks cost nothing when off; TransformerLens's short names reach them.

Tolerance: 1e-5 of the reference's largest entry (float32 against float64), 1e-4 where the
recurrence lies in between.
"""

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.interp import hook_shapes, run_with_cache, run_with_patches
from tfmjax.interp.names import act_name
from tfmjax.models import build, preset

B, T, D, F = 2, 8, 64, 256


def _close(got, want, tol=1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))


def _setup(random_params):
    model = build(preset("tiny-rwkv", vocab_size=16, max_len=24, scan_layers=False))
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 16, (B, T)), jnp.int32)
    return model, random_params(model, 0), {"tokens": tokens}


def test_hooks_are_listed_and_are_the_models_computation(random_params):
    model, params, batch = _setup(random_params)
    shapes = hook_shapes(model, params, batch)
    attn, mlp = "decoder.blocks.1.attn.", "decoder.blocks.1.mlp."
    for name in ("hook_rwkv_r", "hook_rwkv_k", "hook_rwkv_v", "hook_wkv"):
        assert shapes[attn + name] == (B, T, D), name
    assert shapes[mlp + "hook_pre"] == shapes[mlp + "hook_post"] == (B, T, F)
    assert shapes[mlp + "hook_receptance"] == (B, T, D)
    assert act_name("wkv", 1) == "blocks.1.attn.hook_wkv"
    assert act_name("receptance", 1) == "blocks.1.mlp.hook_receptance"
    _, cache = run_with_cache(model, params, batch)
    get = lambda name: np.asarray(cache[name], np.float64)  # noqa: E731
    p = params["params"]["decoder"]["layer_1"]
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    gate = 1 / (1 + np.exp(-get(attn + "hook_rwkv_r")))
    out = (gate * get(attn + "hook_wkv")) @ p["attention"]["output"]["kernel"]
    _close(out, get("decoder.blocks.1.hook_attn_out"))
    k, v = get(attn + "hook_rwkv_k"), get(attn + "hook_rwkv_v")
    w, u = np.exp(p["attention"]["time_decay"]), p["attention"]["time_first"]
    for t in range(T):
        num, den = np.exp(u + k[:, t]) * v[:, t], np.exp(u + k[:, t])
        for i in range(t):
            e = np.exp(-(t - 1 - i) * w + k[:, i])
            num, den = num + e * v[:, i], den + e
        _close(get(attn + "hook_wkv")[:, t], num / den, 1e-4)
    _close(get(mlp + "hook_post"), np.maximum(get(mlp + "hook_pre"), 0) ** 2)
    hidden = get(mlp + "hook_post") @ p["mlp"]["value"]["kernel"]
    _close(get(mlp + "hook_receptance") * hidden, get("decoder.blocks.1.hook_mlp_out"))


def test_an_edit_of_the_wkv_reaches_the_logits(random_params):
    model, params, batch = _setup(random_params)
    clean = model.apply(params, batch)
    name = "decoder.blocks.0.attn.hook_wkv"
    patched, _ = run_with_patches(model, params, batch, {name: lambda x: x.at[:, 3:].set(0.0)})
    np.testing.assert_allclose(patched[:, :3], clean[:, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(patched[:, 3:], clean[:, 3:], atol=1e-3)


def test_hooks_cost_nothing_when_off(random_params, hooks_off):
    model, params, batch = _setup(random_params)
    lowered = lambda: jax.jit(model.apply).lower(params, batch).as_text()  # noqa: E731
    with_hooks = lowered()
    hooks_off("tfmjax.layers.rwkv", "tfmjax.layers.blocks", "tfmjax.models.common")
    assert lowered() == with_hooks
