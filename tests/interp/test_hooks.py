"""Hook points, run_with_cache and run_with_patches, for both families.

What must hold: the hooks cost nothing when off (the same lowered program); cached logits are
the plain ``apply``'s; the cached activations are the model's own (they recombine into each
other: residual sums, patterns from q and k, per-head results); patching with the clean cache
gives the clean logits exactly, and a patch at position t moves nothing before t.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tfmjax.layers.attention as attention_module
from tfmjax.interp import hook_shapes, replace, run_with_cache, run_with_patches
from tfmjax.interp.hooked import ActivationCache, prepare, selection
from tfmjax.kernels import reference
from tfmjax.layers import hooks

FAMILIES = ("decoder_only", "encoder_decoder")


def test_names_follow_transformer_lens_with_stack_prefixes(rows, tiny):
    model, params = tiny("encoder_decoder")
    batch = rows(model, length=6)
    shapes = hook_shapes(model, params, batch)
    B, T, N, H, D = 3, 6, model.config.num_heads, model.config.head_width, model.config.d_model
    assert shapes["encoder.hook_embed"] == (B, T, D)
    assert shapes["encoder.hook_pos_embed"] == (B, T, D)
    assert shapes["encoder.blocks.1.attn.hook_pattern"] == (B, N, T, T)
    assert shapes["encoder.hook_out"] == (B, T, D)
    assert shapes["decoder.blocks.0.cross_attn.hook_pattern"] == (B, N, T, T)
    assert shapes["decoder.blocks.0.cross_attn.hook_result"] == (B, T, N, D)
    assert shapes["decoder.blocks.1.hook_resid_mid_cross"] == (B, T, D)
    assert shapes["decoder.blocks.1.attn.hook_z"] == (B, T, N, H)
    assert shapes["decoder.blocks.0.mlp.hook_post"] == (B, T, model.config.d_ff)
    assert shapes["decoder.ln_final.hook_scale"] == (B, T, 1)
    assert shapes["encoder.ln_final.hook_normalized"] == (B, T, D)
    assert shapes["encoder.blocks.0.attn.hook_attn_scores"] == (B, N, T, T)
    assert shapes["decoder.blocks.1.attn.hook_q_input"] == (B, T, N, D)
    assert shapes["encoder.blocks.1.hook_mlp_in"] == (B, T, D)
    assert not any("layer_" in n or "layers" in n for n in shapes)


def _lowered(model, params, batch) -> str:
    return jax.jit(model.apply).lower(params, batch).as_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_hooks_cost_nothing_when_off(rows, tiny, family, monkeypatch):
    """The plain apply lowers to the same program as a model whose hooks are identities."""
    model, params = tiny(family, scan_layers=False)
    batch = rows(model)
    with_hooks = _lowered(model, params, batch)
    for module in (hooks, attention_module):
        monkeypatch.setattr(module, "hook", lambda m, n, x: x, raising=False)
    for name in ("tfmjax.layers.blocks", "tfmjax.layers.mlp", "tfmjax.layers.norms"):
        monkeypatch.setattr(f"{name}.hook", lambda m, n, x: x)
    monkeypatch.setattr("tfmjax.models.common.hook", lambda m, n, x: x)
    monkeypatch.setattr("tfmjax.models.encoder_decoder.hook", lambda m, n, x: x)
    monkeypatch.setattr(hooks, "wanted", lambda m, n: False)
    monkeypatch.setattr("tfmjax.layers.blocks.wanted", lambda m, n: False)
    monkeypatch.setattr(attention_module, "hook", lambda m, n, x: x)
    assert _lowered(model, params, batch) == with_hooks
    monkeypatch.undo()
    # Turned on, recording nothing: no work that a hook does not gate on being wanted.
    with hooks.hooks_active(capture=()):
        assert _lowered(model, params, batch) == with_hooks


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"position": "rope", "num_kv_heads": 2},
        {"position": "alibi", "num_kv_heads": 1, "activation": "swiglu", "norm": "rmsnorm"},
    ],
    ids=["default", "rope-gqa", "alibi-mqa-swiglu"],
)
def test_cache_is_the_models_own_computation(rows, tiny, family, overrides):
    """Scanned params in; logits equal the plain apply; the activations recombine exactly."""
    model, params = tiny(family, **overrides)
    assert model.config.scan_layers
    batch = rows(model)
    logits, cache = run_with_cache(model, params, batch)
    np.testing.assert_allclose(logits, jax.jit(model.apply)(params, batch), rtol=1e-5, atol=1e-5)
    cfg = model.config
    for stack, layers in model.layer_stacks().items():
        for l in range(layers):
            block = f"{stack}.blocks.{l}"
            mid = cache[f"{block}.hook_resid_pre"] + cache[f"{block}.hook_attn_out"]
            np.testing.assert_allclose(mid, cache[f"{block}.hook_resid_mid"], atol=1e-5)
            if l + 1 < layers:
                np.testing.assert_array_equal(
                    cache[f"{block}.hook_resid_post"],
                    cache[f"{stack}.blocks.{l + 1}.hook_resid_pre"],
                )
            # The pattern is softmax(q k / sqrt(H)) under the family's mask, from q and k
            # (after RoPE: TransformerLens's hook_rot_q and hook_rot_k).
            rotated = "rot_" if cfg.position == "rope" else ""
            q, k = cache[f"{block}.attn.hook_{rotated}q"], cache[f"{block}.attn.hook_{rotated}k"]
            pattern = cache[f"{block}.attn.hook_pattern"]
            np.testing.assert_allclose(jnp.sum(pattern, -1), 1.0, rtol=1e-5)
            if stack == "decoder":
                assert float(jnp.max(jnp.triu(pattern, 1))) == 0.0  # causal
            if cfg.position != "alibi":
                scores = jnp.einsum(
                    "BTNH,BSNH->BNTS", q, jnp.repeat(k, q.shape[2] // k.shape[2], 2)
                )
                scores = scores / np.sqrt(cfg.head_width)
                if stack == "decoder":
                    scores = jnp.where(
                        jnp.tril(jnp.ones(scores.shape[-2:], bool)), scores, -jnp.inf
                    )
                np.testing.assert_allclose(pattern, jax.nn.softmax(scores, -1), atol=1e-5)
            z = cache[f"{block}.attn.hook_z"]
            np.testing.assert_allclose(
                z, reference.weighted_values(pattern, cache[f"{block}.attn.hook_v"]), atol=1e-5
            )
            result = cache[f"{block}.attn.hook_result"]
            bias = params["params"][stack]["layers"]["attention"]["out"].get("bias")
            total = jnp.sum(result, axis=2) + (0.0 if bias is None else bias[l][None, None])
            np.testing.assert_allclose(total, cache[f"{block}.hook_attn_out"], atol=1e-5)


def test_scanned_and_unrolled_params_give_the_same_cache(rows, tiny):
    model, params = tiny("decoder_only")
    unrolled_model, unrolled = model.unrolled(params)
    batch = rows(model)
    _, a = run_with_cache(model, params, batch)
    _, b = run_with_cache(unrolled_model, unrolled, batch)
    assert a.names() == b.names()
    for name in a.names():
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "blockwise"])
def test_pattern_is_formed_whatever_the_kernel(rows, tiny, impl):
    model, params = tiny("decoder_only", attention_impl=impl, window=3)
    batch = rows(model)
    logits, cache = run_with_cache(model, params, batch, names=["*.hook_pattern"])
    np.testing.assert_allclose(logits, jax.jit(model.apply)(params, batch), rtol=1e-5, atol=1e-5)
    pattern = cache["blocks.0.attn.hook_pattern"]
    t, s = np.indices(pattern.shape[-2:])
    outside = ((s > t) | (t - s > 3))[None, None]
    assert float(jnp.max(jnp.abs(pattern * outside))) == 0.0  # causal window


@pytest.mark.parametrize("family", FAMILIES)
def test_patching_with_the_clean_cache_gives_the_clean_logits_exactly(rows, tiny, family):
    model, params = tiny(family)
    batch = rows(model)
    # Everything the output reads without rerouting: residuals, embeddings, q/k/v, z, MLP.
    # Op by op, so that the cache and the patched run round alike (a compiled program may
    # fuse an activation into two consumers and round it differently in each).
    rerouting = ("hook_pattern", "hook_attn_scores", "hook_result")
    rerouting += ("hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input")
    with jax.disable_jit():
        clean_logits, clean = run_with_cache(model, params, batch)
        edits = {n: replace(clean[n]) for n in clean.names() if not n.endswith(rerouting)}
        patched, _ = run_with_patches(model, params, batch, edits)
    np.testing.assert_array_equal(patched, clean_logits)
    # Scores, patterns, per-head results and inputs reroute the output through them: equal
    # within float error.
    edits = {n: replace(clean[n]) for n in clean.names() if n.endswith(rerouting)}
    patched, _ = run_with_patches(model, params, batch, edits)
    np.testing.assert_allclose(patched, clean_logits, rtol=1e-5, atol=1e-5)


def test_a_patch_at_position_t_moves_nothing_before_t(rows, tiny):
    model, params = tiny("decoder_only")
    clean = rows(model, seed=0)
    other = rows(model, seed=1)
    name, t = "decoder.blocks.1.hook_resid_pre", 4
    with jax.disable_jit():
        clean_logits, _ = run_with_cache(model, params, clean)
        _, source = run_with_cache(model, params, other)
        patched, cache = run_with_patches(
            model, params, clean, {name: replace(source[name], name, positions=[t])}, names=[name]
        )
    np.testing.assert_array_equal(cache[name][:, t], source[name][:, t])
    np.testing.assert_array_equal(patched[:, :t], clean_logits[:, :t])
    assert float(jnp.min(jnp.max(jnp.abs(patched[:, t:] - clean_logits[:, t:]), axis=-1))) > 1e-4


def test_head_patch_touches_only_that_head(rows, tiny):
    model, params = tiny("decoder_only")
    batch = rows(model)
    name = "decoder.blocks.0.attn.hook_z"
    with jax.disable_jit():
        _, cache = run_with_patches(
            model, params, batch, {name: replace(0.0, name, heads=[2])}, names=[name]
        )
        _, clean = run_with_cache(model, params, batch, names=[name])
    z = cache[name]
    assert float(jnp.max(jnp.abs(z[:, :, 2]))) == 0.0
    keep = np.array([0, 1, 3])
    np.testing.assert_array_equal(z[:, :, keep], clean[name][:, :, keep])


def test_editing_the_pattern_changes_the_output(rows, tiny):
    """A uniform causal pattern makes each head's z the running mean of v."""
    model, params = tiny("decoder_only")
    batch = rows(model)
    name = "decoder.blocks.0.attn.hook_pattern"

    def uniform(p):
        T = p.shape[-1]
        rows = jnp.tril(jnp.ones((T, T))) / jnp.arange(1, T + 1)[:, None]
        return jnp.broadcast_to(rows, p.shape)

    _, cache = run_with_patches(
        model,
        params,
        batch,
        {name: uniform},
        names=["blocks.0.attn.hook_z", "blocks.0.attn.hook_v"],
    )
    v = cache["blocks.0.attn.hook_v"]
    running_mean = jnp.cumsum(v, axis=1) / jnp.arange(1, v.shape[1] + 1)[None, :, None, None]
    np.testing.assert_allclose(cache["blocks.0.attn.hook_z"], running_mean, rtol=1e-5, atol=1e-6)


def test_jit_with_static_names_and_the_cache_as_a_pytree(rows, tiny):
    model, params = tiny("encoder_decoder")
    batch = rows(model)
    names = ("decoder.blocks.*.cross_attn.hook_pattern", "encoder.hook_out")
    traced = jax.jit(lambda p, b: run_with_cache(model, p, b, names=names))
    logits, cache = traced(params, batch)
    assert isinstance(cache, ActivationCache)
    assert cache.names() == [
        "decoder.blocks.0.cross_attn.hook_pattern",
        "decoder.blocks.1.cross_attn.hook_pattern",
        "encoder.hook_out",
    ]
    assert cache.stack("cross_attn.hook_pattern").shape[:2] == (2, 3)
    # a read-only mapping over the full names, as a user of dicts expects
    assert list(cache) == list(cache.keys()) == cache.names() and len(cache) == 3
    assert [name for name, _ in cache.items()] == cache.names()
    assert list(cache.values())[2] is cache["encoder.hook_out"]
    assert "encoder.hook_out" in cache and "hook_out" in cache and "hook_q" not in cache
    assert cache.get("encoder.hook_nope") is None and dict(cache).keys() == set(cache.names())
    with pytest.raises(TypeError):
        cache["encoder.hook_out"] = 0
    _, eager = run_with_cache(model, params, batch, names=names)
    np.testing.assert_allclose(cache["encoder.hook_out"], eager["encoder.hook_out"], atol=1e-5)


def test_unknown_and_ambiguous_names_are_one_line_errors(rows, tiny):
    model, params = tiny("encoder_decoder")
    batch = rows(model)
    with pytest.raises(KeyError, match="no hook point 'blocks.0.attn.hook_qq'"):
        run_with_cache(model, params, batch, names=["blocks.0.attn.hook_qq"])
    with pytest.raises(KeyError, match="ambiguous"):
        run_with_cache(model, params, batch, names=["blocks.0.attn.hook_q"])
    with pytest.raises(ValueError, match="no head axis"):
        selection("decoder.blocks.0.hook_resid_pre", (1, 4, 8), heads=[0])
    with pytest.raises(ValueError, match="no position axis; patch it by head"):
        selection("decoder.blocks.0.attn.hook_state", (1, 4, 8, 8), positions=[0])
    with pytest.raises(ValueError, match="no position axis; patch it whole"):
        selection("decoder.blocks.0.attn.hook_ssm_state", (1, 16, 4), positions=[0])


def test_prepare_unrolls_and_turns_remat_off(rows, tiny):
    model, params = tiny("decoder_only", remat=True)
    prepared, unrolled = prepare(model, params)
    assert not prepared.config.scan_layers and not prepared.config.remat
    assert "layer_1" in unrolled["params"]["decoder"]
