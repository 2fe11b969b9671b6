"""Mixture-of-experts models: the config's checks, scanned groups of blocks equal to the
unrolled stack, the router's hook points, and the auxiliary losses in the train step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax.config import ConfigError, ModelConfig
from tfmjax.interp import run_with_cache, run_with_patches
from tfmjax.layers.moe import COLLECTION
from tfmjax.layers.stack import stack_params, unstack_params
from tfmjax.models import build
from tfmjax.train.state import create_state
from tfmjax.train.step import make_train_step

SMALL = dict(family="decoder_only", vocab_size=16, d_model=16, num_heads=2, d_ff=24, num_layers=4)


def tokens(rows=2, length=7, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 16, size=(rows, length)).astype(np.int32)
    ids[1, -2:] = 0  # padding
    return ids


def batch(rows=2, length=7):
    ids = tokens(rows, length)
    return {"tokens": jnp.asarray(ids), "loss_mask": jnp.asarray((ids != 0).astype(np.float32))}


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"moe_experts": 2, "moe_top_k": 3},
            r"model.moe_top_k=3 is invalid: .* model.moe_experts=2",
        ),
        ({"moe_experts": -1}, r"model.moe_experts=-1 is invalid: must be >= 0"),
        ({"moe_experts": 4, "moe_every": 3}, r"model.moe_every=3 is invalid: must divide the 4"),
        ({"moe_capacity_factor": -0.5}, r"model.moe_capacity_factor=-0.5 is invalid"),
        ({"moe_z_loss_weight": -1.0}, r"model.moe_z_loss_weight=-1.0 is invalid"),
        (
            {"moe_eval_capacity_factor": -1.0},
            r"model.moe_eval_capacity_factor=-1.0 is invalid: must be >= 0 \(0 = dropless\)",
        ),
        ({"moe_top_k": 0}, r"model.moe_top_k=0 is invalid: must be >= 1"),
    ],
)
def test_bad_moe_fields_are_refused_in_one_line(fields, message):
    with pytest.raises(ConfigError, match=message) as info:
        ModelConfig(**SMALL, **fields)
    assert "\n" not in str(info.value)


def test_unrolled_stacks_take_any_moe_every():
    cfg = ModelConfig(**SMALL, moe_experts=4, moe_every=3, scan_layers=False)
    params = jax.eval_shape(build(cfg).init, jax.random.key(0), batch())["params"]["decoder"]
    moe = [name for name, layer in sorted(params.items()) if "router" in layer["mlp"]]
    assert moe == ["layer_2"]  # blocks n-1, 2n-1, ...: only the third of four


@pytest.mark.parametrize("every", [1, 2])
def test_scanned_groups_equal_the_unrolled_stack(random_params, every):
    """A scanned stack of groups of ``every`` blocks computes what the unrolled stack does
    with the same params (``unstack_params``; ``stack_params`` is its inverse), sown losses
    included; the MoE blocks are layers 1 and 3 when every = 2."""
    cfg = ModelConfig(**SMALL, moe_experts=4, moe_top_k=2, moe_every=every, activation="swiglu")
    model = build(cfg)
    params = random_params(model)
    unrolled, flat = model.unrolled(params)
    layers = flat["params"]["decoder"]
    assert [("router" in layers[f"layer_{i}"]["mlp"]) for i in range(4)] == (
        [True] * 4 if every == 1 else [False, True, False, True]
    )
    back = stack_params(layers, 4, every)
    assert jax.tree.all(jax.tree.map(np.array_equal, back, params["params"]["decoder"]))
    assert jax.tree.all(jax.tree.map(np.array_equal, unstack_params(back, 4, every), layers))
    want, penalty, metrics = jax.jit(unrolled.apply_with_aux)(flat, batch())
    got, got_penalty, got_metrics = jax.jit(model.apply_with_aux)(params, batch())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_penalty, penalty, rtol=1e-5)
    for name in metrics:
        np.testing.assert_allclose(got_metrics[name], metrics[name], rtol=1e-5, err_msg=name)


def test_router_hooks_record_and_reroute(random_params):
    """``hook_expert_indices`` holds the argmax of ``hook_router_logits``; an edit sending
    every token to expert 0 makes the feed-forward's output expert 0's own (top-1, gates
    renormalised to 1, dropless), written here in NumPy, and zero on padding."""
    cfg = ModelConfig(
        **dict(SMALL, num_layers=1),
        moe_experts=4,
        moe_renormalize=True,
        moe_capacity_factor=0.0,
        scan_layers=False,
    )
    model = build(cfg)
    params = random_params(model, 1)
    data = batch()
    _, cache = run_with_cache(model, params, data)
    logits = np.asarray(cache["blocks.0.mlp.hook_router_logits"])
    chosen = np.asarray(cache["blocks.0.mlp.hook_expert_indices"])
    np.testing.assert_array_equal(chosen[..., 0], logits.argmax(-1))
    np.testing.assert_allclose(cache["blocks.0.mlp.hook_expert_weights"], 1.0)

    edits = {"blocks.0.mlp.hook_expert_indices": lambda c: jnp.zeros_like(c)}
    _, patched = run_with_patches(model, params, data, edits, names=["blocks.0.hook_mlp_out"])
    layer = params["params"]["decoder"]["layer_0"]
    x = np.asarray(cache["blocks.0.hook_resid_mid"], np.float64)
    norm, mlp = (
        layer["mlp_norm"],
        {k: np.asarray(v[0]) for k, v in layer["mlp"].items() if k != "router"},
    )
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    xn = (x - mu) / np.sqrt(var + cfg.norm_eps) * np.asarray(norm["scale"]) + np.asarray(
        norm["bias"]
    )
    h = np.maximum(xn @ mlp["up"] + mlp["up_bias"], 0.0)
    want = (h @ mlp["down"] + mlp["down_bias"]) * (tokens() != 0)[..., None]
    out = np.asarray(patched["blocks.0.hook_mlp_out"])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(out, np.asarray(cache["blocks.0.hook_mlp_out"]), atol=1e-3)


def test_train_step_adds_the_weighted_losses_to_the_objective():
    """One SGD step (lr 1, no clipping) moves the params by minus the gradient of the mean
    NLL plus ``aux_weight * aux + z_weight * z`` (each averaged over the MoE layers), written
    here from the sown values; the step reports their means."""
    cfg = ModelConfig(
        **dict(SMALL, num_layers=2),
        moe_experts=4,
        moe_top_k=2,
        moe_every=2,
        moe_aux_loss_weight=0.3,
        moe_z_loss_weight=0.2,
        moe_capacity_factor=1.0,
    )
    model = build(cfg)
    data = batch()
    state = create_state(model, optax.sgd(1.0), data, seed=0)
    step = make_train_step(model, optax.sgd(1.0), optax.constant_schedule(1.0))

    def objective(p):
        logits, sown = model.apply(p, data, mutable=[COLLECTION])
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, data["tokens"][..., None], -1)[..., 0]
        mean_nll = jnp.sum(nll * data["loss_mask"]) / jnp.sum(data["loss_mask"])
        layers = sown[COLLECTION]["decoder"]["layers"]["block_1"]["mlp"]
        aux, z = jnp.mean(layers["aux_loss"][0]), jnp.mean(layers["z_loss"][0])
        return mean_nll + 0.3 * aux + 0.2 * z, (aux, z, jnp.mean(layers["dropped"][0]))

    grads, (aux, z, dropped) = jax.jit(jax.grad(objective, has_aux=True))(state.params)
    want = jax.tree.map(lambda p, g: p - g, state.params, grads)
    new, _ = jax.jit(step)(state, data)
    for got, ref in zip(jax.tree.leaves(new.params), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    tokens = float(jnp.sum(data["loss_mask"]))
    np.testing.assert_allclose(new.window["moe_aux_loss_sum"], aux * tokens, rtol=1e-5)
    np.testing.assert_allclose(new.window["moe_z_loss_sum"], z * tokens, rtol=1e-5)
    np.testing.assert_allclose(new.window["moe_dropped_fraction_sum"], dropped * tokens, atol=1e-5)
    assert float(aux) > 0 and float(z) > 0


def test_a_dense_model_keeps_its_window_and_logits():
    """No MoE: ``apply_with_aux`` is the plain ``apply`` and the log window has no MoE sums
    (so a checkpoint written before mixtures existed still restores)."""
    cfg = ModelConfig(**SMALL)
    model = build(cfg)
    data = batch()
    state = create_state(model, optax.sgd(1.0), data, seed=0)
    assert not any(key.startswith("moe_") for key in state.window)
    logits, penalty, metrics = model.apply_with_aux(state.params, data)
    np.testing.assert_array_equal(logits, model.apply(state.params, data))
    assert float(penalty) == 0.0 and metrics == {}
    replaced = dataclasses.replace(cfg, moe_top_k=2)  # moe_* fields alone change nothing
    np.testing.assert_array_equal(build(replaced).apply(state.params, data), logits)


def test_a_config_saved_before_mixtures_loads_as_dense_and_resumes_unchanged():
    """A checkpoint's config without the ``moe_*`` fields and ``mesh.expert``: they load as
    their defaults (dense, expert axis 1) and a resume sees no config change."""
    from tfmjax.config import from_dict, load
    from tfmjax.train.resume import config_changes

    now = load("configs/reverse_decoder.toml", [])
    saved = now.to_dict()
    for key in [k for k in saved["model"] if k.startswith("moe_")]:
        del saved["model"][key]
    del saved["mesh"]["expert"]
    old = from_dict(saved)
    assert old.model.moe_experts == 0 and old.mesh.expert == 1
    assert config_changes(saved, now) == ([], [])


@pytest.mark.parametrize("top_k", [1, 2])
def test_capacity_dropping_is_causal_and_blind_to_left_padding(random_params, top_k):
    """With a capacity that drops choices (factor 0.5): a changed future token never changes
    an earlier logit (slots go in token order), and left padding (segment id 0, which takes no
    slot) leaves the real tokens' logits as they are unpadded."""
    cfg = ModelConfig(
        **dict(SMALL, num_layers=2),
        moe_experts=4,
        moe_top_k=top_k,
        moe_capacity_factor=0.5,
        moe_eval_capacity_factor=None,  # the forward below (no dropout) drops as training does
    )
    model = build(cfg)
    ids = jnp.asarray(np.random.default_rng(1).integers(3, 16, size=(2, 8)), jnp.int32)
    params = random_params(model, 2)
    forward = jax.jit(model.apply_with_aux)
    logits, _, metrics = forward(params, {"tokens": ids})
    assert float(metrics["moe_dropped_fraction"]) > 0  # the case drops
    changed = ids.at[:, 5:].set((ids[:, 5:] + 1 - 3) % 13 + 3)
    new_logits = forward(params, {"tokens": changed})[0]
    np.testing.assert_allclose(new_logits[:, :6], logits[:, :6], rtol=1e-5, atol=1e-5)
    assert not np.allclose(new_logits[:, 6:], logits[:, 6:], atol=1e-3)

    pad = 3
    padded = {
        "tokens": jnp.pad(ids, ((0, 0), (pad, 0))),
        "segment_ids": jnp.pad(jnp.ones_like(ids), ((0, 0), (pad, 0))),
        "positions": jnp.pad(jnp.broadcast_to(jnp.arange(8), ids.shape), ((0, 0), (pad, 0))),
    }
    got = forward(params, padded)[0][:, pad:]
    np.testing.assert_allclose(got, logits, rtol=1e-5, atol=1e-5)


def test_training_and_evaluation_forwards_take_their_own_capacity(random_params):
    """``moe_capacity_factor`` 0.5 drops choices in the training forward (dropout on); the
    forward without dropout takes ``moe_eval_capacity_factor``: by default 0, dropless, the
    logits of a model trained dropless with the same params (bit for bit: the same
    program); with None, the training factor's drops and logits."""
    fields = dict(SMALL, num_layers=2, moe_experts=4, moe_top_k=2)
    assert ModelConfig(**fields).moe_capacity_factor == 0.0  # dropless by default
    cfg = ModelConfig(**fields, moe_capacity_factor=0.5)
    assert cfg.moe_eval_capacity_factor == 0.0 and cfg.moe_eval_capacity == 0.0
    data = {"tokens": jnp.asarray(tokens())}
    params = random_params(build(cfg), 3)

    def forward(config, deterministic):
        model = build(config, deterministic=deterministic)
        rngs = None if deterministic else {"dropout": jax.random.key(0)}
        logits, _, metrics = jax.jit(lambda p: model.apply_with_aux(p, data, rngs=rngs))(params)
        return np.asarray(logits), float(metrics["moe_dropped_fraction"])

    train_logits, train_dropped = forward(cfg, deterministic=False)
    eval_logits, eval_dropped = forward(cfg, deterministic=True)
    assert train_dropped > 0 and eval_dropped == 0.0
    dropless = ModelConfig(**fields, moe_capacity_factor=0.0)
    np.testing.assert_array_equal(eval_logits, forward(dropless, deterministic=True)[0])
    assert not np.allclose(eval_logits, train_logits, atol=1e-3)

    same = dataclasses.replace(cfg, moe_eval_capacity_factor=None)
    assert same.moe_eval_capacity == 0.5
    same_logits, same_dropped = forward(same, deterministic=True)
    np.testing.assert_array_equal(same_logits, train_logits)
    assert same_dropped == train_dropped
