"""TransformerLens's hook points, short names and cache helpers: each value recomputed in NumPy
(float64) from the cache's own inputs and the params; edits of the new hook points reach the
output the way TransformerLens's do; folding the final norm keeps the logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.interp import (
    fold_final_norm,
    logit_attribution,
    replace,
    run_with_cache,
    run_with_patches,
)
from tfmjax.interp.names import act_name

CASES = {
    "learned-layernorm": ("decoder_only", {}),
    "rope-gqa-rmsnorm": (
        "decoder_only",
        {"position": "rope", "num_kv_heads": 2, "norm": "rmsnorm"},
    ),
    "alibi-mqa": ("decoder_only", {"position": "alibi", "num_kv_heads": 1}),
    "encoder-decoder": ("encoder_decoder", {}),
}
TOL = dict(rtol=2e-5, atol=2e-5)


def f64(x):
    return np.asarray(x, np.float64)


def norm_np(x, cfg):
    """``(scale, normalized)`` of the model's norm over the last axis, in NumPy."""
    x = f64(x)
    if cfg.norm == "layernorm":
        x = x - x.mean(-1, keepdims=True)
    scale = np.sqrt((x**2).mean(-1, keepdims=True) + cfg.norm_eps)
    return scale, x / scale


def affine(normalized, norm_params):
    y = normalized * f64(norm_params["scale"])
    return y + f64(norm_params["bias"]) if "bias" in norm_params else y


def rope_np(x, base):
    """Interleaved RoPE at positions 0..T-1: pair i of ``x [B,T,N,H]`` turned by t·base^(-2i/H)."""
    x = f64(x)
    B, T, N, H = x.shape
    angles = np.arange(T)[:, None] * base ** (-2.0 * np.arange(H // 2) / H)  # [T,H/2]
    cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


def scores_np(q, k, cfg, causal):
    """Scaled logits ``[B,N,T,S]`` (+ ALiBi), blocked entries -inf."""
    N, K, H = q.shape[2], k.shape[2], q.shape[3]
    k = np.repeat(f64(k), N // K, axis=2)
    scores = np.einsum("btnh,bsnh->bnts", f64(q), k) / np.sqrt(H)
    T, S = scores.shape[-2:]
    distance = np.abs(np.arange(T)[:, None] - np.arange(S)[None])
    if cfg.position == "alibi":
        slopes = 2.0 ** (-8.0 * np.arange(1, N + 1) / N)
        scores = scores - slopes[:, None, None] * distance[None]
    if causal:
        scores = np.where(np.tril(np.ones((T, S), bool)), scores, -np.inf)
    return scores


def projection(x, dense):
    """``x [B,T,D]`` through a ``[D,N,H]`` projection (and its bias)."""
    y = np.einsum("btd,dnh->btnh", f64(x), f64(dense["kernel"]))
    return y + f64(dense["bias"]) if "bias" in dense else y


def check_block(cache, cfg, block_params, stack, l):
    """Every new hook point of one block against NumPy."""
    block, attn = f"{stack}.blocks.{l}", block_params["attention"]
    x = cache[f"{block}.hook_resid_pre"]
    scale, normalized = norm_np(x, cfg)
    np.testing.assert_allclose(cache[f"{block}.ln1.hook_scale"], scale, **TOL)
    np.testing.assert_allclose(cache[f"{block}.ln1.hook_normalized"], normalized, **TOL)
    attn_input = affine(normalized, block_params["attention_norm"])
    q, k = projection(attn_input, attn["query"]), projection(attn_input, attn["key"])
    np.testing.assert_allclose(cache[f"{block}.attn.hook_q"], q, **TOL)
    np.testing.assert_allclose(cache[f"{block}.attn.hook_k"], k, **TOL)
    if cfg.position == "rope":
        q, k = rope_np(q, cfg.rope_base), rope_np(k, cfg.rope_base)
        np.testing.assert_allclose(cache[f"{block}.attn.hook_rot_q"], q, **TOL)
        np.testing.assert_allclose(cache[f"{block}.attn.hook_rot_k"], k, **TOL)
    else:
        assert f"{block}.attn.hook_rot_q" not in cache
    scores = scores_np(q, k, cfg, causal=stack == "decoder")
    got = f64(cache[f"{block}.attn.hook_attn_scores"])
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(scores))
    np.testing.assert_allclose(
        np.where(np.isinf(got), 0, got), np.where(np.isinf(scores), 0, scores), **TOL
    )
    pattern = np.exp(scores - scores.max(-1, keepdims=True))
    pattern /= pattern.sum(-1, keepdims=True)
    np.testing.assert_allclose(cache[f"{block}.attn.hook_pattern"], pattern, **TOL)
    N, K = cfg.num_heads, cfg.num_kv_heads
    per_head = np.broadcast_to(f64(x)[:, :, None], (*x.shape[:2], N, x.shape[-1]))
    np.testing.assert_array_equal(cache[f"{block}.attn.hook_attn_in"], per_head)
    np.testing.assert_array_equal(cache[f"{block}.attn.hook_q_input"], per_head)
    np.testing.assert_array_equal(cache[f"{block}.attn.hook_v_input"], per_head[:, :, :K])
    mid = "hook_resid_mid_cross" if f"{block}.hook_resid_mid_cross" in cache else "hook_resid_mid"
    np.testing.assert_array_equal(cache[f"{block}.hook_mlp_in"], cache[f"{block}.{mid}"])
    _, normalized = norm_np(cache[f"{block}.hook_mlp_in"], cfg)
    np.testing.assert_allclose(cache[f"{block}.ln2.hook_normalized"], normalized, **TOL)


@pytest.mark.parametrize("case", CASES)
def test_new_hook_points_are_the_models_own_values(rows, tiny, case):
    family, overrides = CASES[case]
    model, params = tiny(family, **overrides)
    logits, cache = run_with_cache(model, params, rows(model), ["*"])  # split inputs too
    np.testing.assert_allclose(logits, jax.jit(model.apply)(params, rows(model)), **TOL)
    cfg, (_, unrolled) = model.config, model.unrolled(params)
    for stack, layers in model.layer_stacks().items():
        for l in range(layers):
            check_block(cache, cfg, unrolled["params"][stack][f"layer_{l}"], stack, l)
        final = cache[f"{stack}.blocks.{layers - 1}.hook_resid_post"]
        scale, normalized = norm_np(final, cfg)
        np.testing.assert_allclose(cache[f"{stack}.ln_final.hook_scale"], scale, **TOL)
        np.testing.assert_allclose(cache[f"{stack}.ln_final.hook_normalized"], normalized, **TOL)


def test_split_input_and_mlp_in_edits_feed_their_sublayer_only(rows, tiny):
    model, params = tiny("decoder_only", num_kv_heads=2)
    batch, block = rows(model), "decoder.blocks.0"
    names = [f"{block}.{n}" for n in ("attn.hook_q", "attn.hook_k", "hook_resid_pre")]
    names += [f"{block}.{n}" for n in ("hook_resid_mid", "hook_mlp_out", "hook_resid_post")]
    clean_logits, clean = run_with_cache(model, params, batch, names)
    # Head 1's query input doubled: only head 1's query moves, to the projection of LN(2x).
    double_head_1 = lambda x: x.at[:, :, 1].multiply(2.0)
    logits, edited = run_with_patches(
        model, params, batch, {"blocks.0.hook_q_input": double_head_1}, names
    )
    q, q_clean = f64(edited[f"{block}.attn.hook_q"]), f64(clean[f"{block}.attn.hook_q"])
    np.testing.assert_allclose(q[:, :, [0, 2, 3]], q_clean[:, :, [0, 2, 3]], **TOL)
    _, unrolled = model.unrolled(params)
    layer = unrolled["params"]["decoder"]["layer_0"]
    _, normalized = norm_np(2.0 * f64(clean[f"{block}.hook_resid_pre"]), model.config)
    expected = projection(affine(normalized, layer["attention_norm"]), layer["attention"]["query"])
    np.testing.assert_allclose(q[:, :, 1], expected[:, :, 1], **TOL)
    np.testing.assert_allclose(edited[f"{block}.attn.hook_k"], clean[f"{block}.attn.hook_k"], **TOL)
    assert float(jnp.max(jnp.abs(logits - clean_logits))) > 1e-4
    # The MLP reads a zeroed input; the residual sum still adds its output to resid_mid.
    _, edited = run_with_patches(
        model, params, batch, {f"{block}.hook_mlp_in": replace(0.0)}, names
    )
    np.testing.assert_array_equal(
        edited[f"{block}.hook_resid_mid"], clean[f"{block}.hook_resid_mid"]
    )
    total = f64(edited[f"{block}.hook_resid_mid"]) + f64(edited[f"{block}.hook_mlp_out"])
    np.testing.assert_allclose(edited[f"{block}.hook_resid_post"], total, **TOL)
    assert (
        float(jnp.max(jnp.abs(edited[f"{block}.hook_mlp_out"] - clean[f"{block}.hook_mlp_out"])))
        > 1e-3
    )


def test_editing_the_scores_moves_the_pattern(rows, tiny):
    """Key 0 blocked for every query after the first: its weight is 0, the rows still sum to 1."""
    model, params = tiny("decoder_only")
    name = "blocks.0.attn.hook_attn_scores"
    block_key_0 = lambda s: s.at[..., 1:, 0].set(-jnp.inf)
    _, cache = run_with_patches(
        model, params, rows(model), {name: block_key_0}, names=["blocks.0.attn.hook_pattern"]
    )
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert float(jnp.max(pattern[..., 1:, 0])) == 0.0
    np.testing.assert_allclose(jnp.sum(pattern, -1), 1.0, rtol=1e-6)


def test_short_names_are_transformer_lens_names(rows, tiny):
    # TransformerLens's own examples of get_act_name (its docstring), and the aliases.
    assert act_name("k", 6, "a") == "blocks.6.attn.hook_k"
    assert act_name("pre", 2) == "blocks.2.mlp.hook_pre"
    assert act_name("embed") == "hook_embed"
    assert act_name("normalized", 27, "ln2") == "blocks.27.ln2.hook_normalized"
    assert act_name("k6") == "blocks.6.attn.hook_k"
    assert act_name("scale4ln1") == "blocks.4.ln1.hook_scale"
    assert act_name("pre5") == "blocks.5.mlp.hook_pre"
    assert act_name("scale") == "ln_final.hook_scale"
    assert act_name("attn", 1) == "blocks.1.attn.hook_pattern"
    assert act_name("resid_pre", 0) == "blocks.0.hook_resid_pre"
    model, params = tiny("decoder_only")
    _, cache = run_with_cache(model, params, rows(model))
    assert cache["pattern", -1] is cache["decoder.blocks.1.attn.hook_pattern"]
    assert cache["scale"] is cache["decoder.ln_final.hook_scale"]
    assert cache["embed"] is cache["decoder.hook_embed"]
    assert ("z", 0) in cache and ("nope", 0) not in cache and "nope" not in cache
    # By default the split inputs (the residual repeated per head) are left out, as in
    # TransformerLens; named, they are recorded.
    assert "blocks.0.attn.hook_q_input" not in cache and "blocks.0.attn.hook_q" in cache
    _, split = run_with_cache(model, params, rows(model), ["blocks.*.hook_q_input"])
    assert split.names() == [f"decoder.blocks.{l}.attn.hook_q_input" for l in range(2)]
    rebuilt = jax.tree.map(lambda x: x, cache)  # a pytree rebuilt from its leaves: unbound
    with pytest.raises(ValueError, match="cache.bind"):
        rebuilt.decompose_resid()
    assert rebuilt.bind(model, params).decompose_resid().shape[0] == 6


@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder"])
def test_helpers_against_numpy(rows, tiny, family):
    model, params = tiny(family)
    cfg = model.config
    _, cache = run_with_cache(model, params, rows(model))
    at = lambda name: f64(cache[f"decoder.{name}"])
    final = at("blocks.1.hook_resid_post")
    stack, labels = cache.decompose_resid(return_labels=True)
    sublayers = ["attn_out", "cross_attn_out", "mlp_out"][:: 1 if family != "decoder_only" else 2]
    assert labels == ["embed", "pos_embed"] + [f"{l}_{s}" for l in range(2) for s in sublayers]
    np.testing.assert_allclose(f64(stack).sum(0), final, **TOL)
    upto = cache.decompose_resid(layer=1, mlp_input=True)  # what ln2 of layer 1 reads
    np.testing.assert_allclose(f64(upto).sum(0), at("blocks.1.hook_mlp_in"), **TOL)
    # Through the norm frozen from the cache: the parts add up to its normalised input.
    ln = cache.apply_ln_to_stack(stack)
    np.testing.assert_allclose(f64(ln).sum(0), at("ln_final.hook_normalized"), **TOL)
    sliced = cache.decompose_resid(layer=1, pos_slice=(1, 4))  # positions 1..3 of each part
    ln1 = cache.apply_ln_to_stack(sliced, 1, pos_slice=(1, 4))
    np.testing.assert_allclose(f64(ln1).sum(0), at("blocks.1.ln1.hook_normalized")[:, 1:4], **TOL)
    acc, labels = cache.accumulated_resid(incl_mid=True, return_labels=True, pos_slice=-1)
    mids = ["mid", "mid_cross"][: 2 if family != "decoder_only" else 1]
    assert labels == [f"{l}_{s}" for l in range(2) for s in ["pre", *mids]] + ["final_post"]
    np.testing.assert_array_equal(acc[1], cache["decoder.blocks.0.hook_resid_mid"][:, -1])
    # The logit lens: the final norm applied to each component on its own, weight and bias too.
    lens = cache.accumulated_resid(apply_ln=True, pos_slice=[2, 5])
    head = params["params"]["head"]["final_norm"]
    _, normalized = norm_np(final[:, [2, 5]], cfg)
    np.testing.assert_allclose(lens[-1], affine(normalized, head), **TOL)
    heads, labels = cache.stack_head_results(incl_remainder=True, return_labels=True)
    N = cfg.num_heads
    assert labels == [f"L{l}H{n}" for l in range(2) for n in range(N)] + ["remainder"]
    np.testing.assert_allclose(f64(heads).sum(0), final, **TOL)
    np.testing.assert_array_equal(heads[N + 2], cache["decoder.blocks.1.attn.hook_result"][:, :, 2])


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": True, "output_bias": True}])
def test_folded_logit_attrs_are_the_direct_logit_attribution(rows, tiny, overrides):
    """TransformerLens's logit_attrs on the folded model = our DLA on the model as trained."""
    model, params = tiny("decoder_only", **overrides)
    batch = rows(model)
    logits, cache = run_with_cache(model, params, batch)
    folded_model, folded = fold_final_norm(model, params)
    folded_logits, folded_cache = run_with_cache(folded_model, folded, batch)
    np.testing.assert_allclose(folded_logits, logits, **TOL)
    assert not folded_model.config.tie_embeddings
    np.testing.assert_array_equal(folded["params"]["head"]["final_norm"]["scale"], 1.0)
    good, bad = jnp.array([5, 6, 7]), jnp.array([8, 9, 10])
    stack = folded_cache.decompose_resid(pos_slice=-1)
    attrs = folded_cache.logit_attrs(stack, good, bad, pos_slice=-1)  # [C,B]
    per_row = lambda ids: jnp.broadcast_to(ids[:, None], batch["tokens"].shape)
    names, ours = logit_attribution(model, params, cache, tokens=(per_row(good), per_row(bad)))
    ours = dict(zip(names, f64(ours[:, :, -1]), strict=True))
    grouped = [ours["embed"], ours["pos_embed"]]
    for l in range(2):
        grouped.append(
            sum(v for n, v in ours.items() if n.startswith(f"L{l}H") or n == f"L{l}attn_bias")
        )
        grouped.append(ours[f"L{l}mlp"])
    np.testing.assert_allclose(attrs, np.stack(grouped), **TOL)
    bias = f64(folded["params"]["head"]["output_bias"])
    rows_ = np.arange(3)
    difference = f64(logits)[rows_, -1, good] - f64(logits)[rows_, -1, bad]
    np.testing.assert_allclose(f64(attrs).sum(0) + bias[good] - bias[bad], difference, **TOL)
    # Unfolded, the same call leaves the norm's weight out, as TransformerLens does.
    unfolded = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), good, bad, pos_slice=-1)
    assert float(jnp.max(jnp.abs(unfolded - attrs))) > 1e-4


def test_helpers_refuse_what_they_cannot_read(rows, tiny):
    """A component missing from a partial cache is a KeyError, not a shorter stack; a
    post-norm model is refused in one line; short names read the head's stack."""
    model, params = tiny("encoder_decoder")
    _, partial = run_with_cache(model, params, rows(model), ["*.hook_mlp_out", "*.hook_embed"])
    with pytest.raises(KeyError, match="hook_pos_embed"):
        partial.decompose_resid()
    _, cache = run_with_cache(model, params, rows(model))
    assert cache["pattern", 0] is cache["decoder.blocks.0.attn.hook_pattern"]
    assert cache["scale"] is cache["decoder.ln_final.hook_scale"]
    with pytest.raises(ValueError, match=r"token id 16 is outside the vocabulary \(ids 0..15\)"):
        cache.logit_attrs(cache.decompose_resid(pos_slice=-1), jnp.array([3, 16, 4]))
    post, post_params = tiny("decoder_only", norm_position="post")
    _, post_cache = run_with_cache(post, post_params, rows(post))
    with pytest.raises(ValueError, match="need a pre-norm model") as info:
        post_cache.decompose_resid()
    assert "\n" not in str(info.value)
