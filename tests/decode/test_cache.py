"""Cached decoding == the full uncached forward, at every step; cache layout and size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.decode import full_logits
from tfmjax.models import build, kv_cache_bytes
from tfmjax.models.prompts import as_right_padded

# The family methods, jitted as the generation loop runs them (``M`` new tokens).
PREFILL = jax.jit(
    lambda model, params, arrays, M: model.prefill(params, arrays, M), static_argnums=(0, 3)
)
STEP = jax.jit(
    lambda model, params, cache, ids: model.decode_step(params, cache, ids), static_argnums=0
)

# Every positional encoding in both families; GQA, MQA, sliding windows and unrolled layers
# ride along (each case costs three compiles, so features share cases).
DECODER_ONLY = [
    ("tiny-gpt2", {}),  # learned, MHA
    ("tiny-gpt2", {"position": "sinusoidal", "window": 3, "scan_layers": False}),
    ("tiny-gpt2", {"position": "alibi", "num_kv_heads": 2}),  # GQA
    ("tiny-gpt2", {"position": "relative", "num_kv_heads": 1}),  # MQA
    ("tiny-llama", {"window": 2}),  # RoPE, GQA, window
    ("tiny-gpt2", {"attention_stride": 3}),  # strided sparse pattern
    ("tiny-mla", {}),  # latent attention, decoupled RoPE, absorbed at decode time
    ("tiny-mla", {"position": "alibi", "q_rank": None, "rope_dim": None, "window": 4}),
    ("tiny-linear", {}),  # recurrent state
    ("tiny-linear", {"feature_map": "favor", "num_features": 16, "num_kv_heads": 2}),
    ("tiny-retnet", {"num_layers": 1}),  # retention: RoPE, chunkwise prefill, then steps
    ("tiny-mamba", {"num_layers": 1}),  # selective scan: scan and convolution states
    ("tiny-rwkv", {}),  # rwkv: WKV state and both token shifts (time-mix, channel-mix)
    ("tiny-mixtral", {}),  # mixture of experts: top-2, dropless, every block
    # top-1 every other block (a scanned stack of 2-block groups); dropless: with a capacity
    # the prefill could drop a token that one-token steps never drop
    ("tiny-switch", {"moe_capacity_factor": 0.0, "num_layers": 4}),
    ("tiny-gpt2", {"position": "fire", "num_kv_heads": 2}),  # FIRE (Li et al. 2023)
    ("tiny-gpt2", {"position": "abacus", "digit_first_id": 5}),  # places carried per step
    ("tiny-gpt2", {"position_sampling": "randomized", "max_position": 64}),  # learned, 64 rows
    ("tiny-gpt2", {"position": "relative", "position_sampling": "randomized", "max_position": 40}),
]
ENCODER_DECODER = [
    ("tiny-vaswani", {}),  # sinusoidal, post-norm
    ("tiny-vaswani", {"position": "learned", "norm_position": "pre", "num_kv_heads": 2}),
    ("tiny-vaswani", {"position": "rope", "num_kv_heads": 1, "window": 2}),
    ("tiny-vaswani", {"position": "alibi"}),
    ("tiny-vaswani", {"position": "relative", "window": 2, "scan_layers": False}),
    ("tiny-vaswani", {"attention": "mla", "kv_rank": 24, "global_tokens": 1}),
    ("tiny-vaswani", {"attention": "linear", "position": "rope", "num_kv_heads": 1}),
    ("tiny-vaswani", {"attention": "retention", "num_layers": 1}),  # decoder self-mixer only
    ("tiny-vaswani", {"attention": "selective_scan", "num_layers": 1}),
    ("tiny-vaswani", {"attention": "rwkv", "activation": "relu", "num_layers": 1}),
    ("tiny-vaswani", {"attention": "nystrom", "num_landmarks": 3, "num_layers": 1}),  # encoder
    ("tiny-vaswani", {"attention": "linformer", "linformer_rank": 3, "num_layers": 1}),  # encoder
    ("tiny-vaswani", {"moe_experts": 4, "moe_top_k": 2, "moe_capacity_factor": 0.0}),
    ("tiny-vaswani", {"position": "fire"}),
    # BigBird: window + random blocks of 2 on both sides (bidirectional in the encoder)
    ("tiny-vaswani", {"window": 1, "random_blocks": 1, "random_block_size": 2}),
    # Abacus places; the encoder's counted from each number's end
    ("tiny-vaswani", {"position": "abacus", "digit_first_id": 5, "abacus_count_from": "end"}),
    ("tiny-vaswani", {"position": "alibi", "position_sampling": "randomized", "max_position": 64}),
]
RECURRENT = ("linear", "retention", "selective_scan", "rwkv")  # a constant-size state, no slots
STEPS = 5
TOL = dict(rtol=1e-5, atol=1e-5)


def _ids(cfg, rows):
    """Prompt rows of mixed lengths (right-padded) and a teacher-forced continuation."""
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, cfg.vocab_size, size=n)) for n in rows]
    continuation = rng.integers(0, cfg.vocab_size, size=(len(rows), STEPS)).astype(np.int32)
    return as_right_padded(prompts, cfg.vocab_size), continuation


@pytest.mark.parametrize("name,overrides", DECODER_ONLY, ids=[f"{n}-{o}" for n, o in DECODER_ONLY])
def test_decoder_only_cached_logits_match_full_forward(tiny, name, overrides):
    model, params = tiny(name, **overrides)
    cfg = model.config
    prompts, cont = _ids(cfg, [3, 0, 6, 1])
    n = (prompts != 0).sum(1)
    # Reference: right-padded rows [prompt, continuation], one full uncached forward.
    # The last column is a placeholder: causal logits there never depend on it.
    tokens = np.zeros((len(n), prompts.shape[1] + STEPS + 1), np.int32)
    for i, k in enumerate(n):
        tokens[i, :k], tokens[i, k : k + STEPS], tokens[i, k + STEPS] = prompts[i, :k], cont[i], 1
    segment_ids = (np.arange(tokens.shape[1])[None] <= (n + STEPS)[:, None]).astype(np.int32)
    ref = np.asarray(full_logits(model, params, jnp.asarray(tokens), jnp.asarray(segment_ids)))
    # Cached: left-padded prompt prefilled in one pass, then one token per step.
    arrays = tuple(map(jnp.asarray, model.prompt_arrays(prompts)))
    logits, cache = PREFILL(model, params, arrays, STEPS + 1)
    slots = 0 if cfg.attention in RECURRENT else arrays[0].shape[1] + STEPS
    assert cache.capacity == slots
    rows = np.arange(len(n))
    for t in range(STEPS + 1):
        np.testing.assert_allclose(np.asarray(logits), ref[rows, n + t], **TOL, err_msg=f"step {t}")
        if t < STEPS:
            logits, cache = STEP(model, params, cache, jnp.asarray(cont[:, t]))
    np.testing.assert_array_equal(np.asarray(cache.lengths), n + 1 + STEPS)


@pytest.mark.parametrize(
    "name,overrides", ENCODER_DECODER, ids=[f"{n}-{o}" for n, o in ENCODER_DECODER]
)
def test_encoder_decoder_cached_logits_match_full_forward(tiny, name, overrides):
    model, params = tiny(name, **overrides)
    cfg = model.config
    inputs, cont = _ids(cfg, [2, 5, 1])
    # A placeholder last column makes the reference as wide as the cache (randomized
    # positions at evaluation draw by width); causal logits never depend on it.
    full = jnp.asarray(np.concatenate([cont, np.ones_like(cont[:, :1])], axis=1))
    ref = np.asarray(full_logits(model, params, full, jnp.ones_like(full), jnp.asarray(inputs)))
    logits, cache = PREFILL(model, params, (jnp.asarray(inputs),), STEPS + 1)
    assert cache.capacity == (0 if cfg.attention in RECURRENT else STEPS + 1)
    assert all("cross" in layer for layer in cache.layers)
    assert cache.encoded.shape[:2] == inputs.shape
    cross_before = [layer["cross"]["k"] for layer in cache.layers]
    for t in range(STEPS):
        np.testing.assert_allclose(np.asarray(logits), ref[:, t], **TOL, err_msg=f"step {t}")
        logits, cache = STEP(model, params, cache, jnp.asarray(cont[:, t]))
    # Cross keys/values were computed once and carried unchanged.
    for layer, before in zip(cache.layers, cross_before, strict=True):
        np.testing.assert_array_equal(np.asarray(layer["cross"]["k"]), np.asarray(before))


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("tiny-gpt2", {}),
        ("tiny-llama", {}),
        ("tiny-llama", {"num_kv_heads": 1}),
        ("tiny-vaswani", {"num_kv_heads": 2}),
    ],
)
def test_cache_size_matches_formula_and_pytree(name, overrides):
    from tfmjax.models import preset

    cfg = preset(name, **overrides)
    B, S = 3, 40
    model = build(cfg)
    cache = model.init_cache(B, S)
    L = cfg.num_layers if cfg.family == "decoder_only" else cfg.decoder_layers
    K, H = cfg.kv_heads, cfg.head_width
    formula = 2 * B * L * K * S * H * 4  # keys and values, float32
    assert len(cache.layers) == L
    for sa in cache.self_attention:  # per layer, head-major: [B, K, S_max, H]
        assert sa["k"].shape == sa["v"].shape == (B, K, S, H)
    assert cache.kv_bytes == formula == kv_cache_bytes(B, L, K, S, H, jnp.float32)
    assert model.kv_cache_bytes(B, S) == formula
    assert cache.nbytes == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    assert cache.nbytes == formula + L * B * S * 4 + L * 4 + B * 4  # + segment ids, index, lengths
    assert sum(sa["k"].nbytes + sa["v"].nbytes for sa in cache.self_attention) == formula
    if K < cfg.num_heads:  # GQA / MQA shrink it by N / K
        full = kv_cache_bytes(B, L, cfg.num_heads, S, H)
        assert cache.kv_bytes * (cfg.num_heads // K) == full


def test_cache_bytes_of_mla_and_linear_attention():
    """MLA caches ``R + Hr`` numbers per token and layer; linear attention a state whose size
    does not depend on the length. Formula == the cache pytree, and the per-token figure
    against MHA, GQA and MQA of the same width."""
    from tfmjax.models import preset

    B, S = 2, 40
    mla = preset("tiny-mla")  # width 64, 4 heads of 16, R = 32, Hr = 8
    cache = build(mla).init_cache(B, S)
    L = mla.num_layers
    assert all(sa["k"].shape == (B, 1, S, 32 + 8) for sa in cache.self_attention)
    assert cache.kv_bytes == build(mla).kv_cache_bytes(B, S) == B * L * S * 40 * 4
    per_token = {  # numbers cached per token and layer
        "mha": kv_cache_bytes(1, 1, 4, 1, 16) // 4,
        "gqa": kv_cache_bytes(1, 1, 2, 1, 16) // 4,
        "mqa": kv_cache_bytes(1, 1, 1, 1, 16) // 4,
        "mla": build(mla).kv_cache_bytes(1, 1) // (L * 4),
    }
    assert per_token == {"mha": 128, "gqa": 64, "mqa": 32, "mla": 40}

    for name, overrides, F in [
        ("tiny-linear", {}, 16),
        ("tiny-linear", {"feature_map": "favor", "num_features": 24, "num_kv_heads": 2}, 24),
    ]:
        cfg = preset(name, **overrides)
        K, H = cfg.kv_heads, cfg.head_width
        short, long = build(cfg).init_cache(B, 8), build(cfg).init_cache(B, 4096)
        assert short.kv_bytes == long.kv_bytes == build(cfg).kv_cache_bytes(B, 4096)
        assert short.kv_bytes == B * cfg.num_layers * K * (F * (H + 1) + 1) * 4  # + log scale
        assert all(sa["s"].shape == (B, K, F, H) for sa in short.self_attention)


def test_gpt2_small_cache_bytes_without_memory():
    from tfmjax.models import preset

    cfg = preset("gpt2-small")
    model = build(cfg)
    cache = jax.eval_shape(lambda: model.init_cache(8, 1024))
    ks = [layer["k"] for layer in cache.layers]
    assert len(ks) == 12 and ks[0].shape == (8, 12, 1024, 64)
    assert sum(2 * k.size * k.dtype.itemsize for k in ks) == model.kv_cache_bytes(8, 1024)
    assert model.kv_cache_bytes(8, 1024) == 2 * 8 * 12 * 12 * 1024 * 64 * 4


def test_reorder_and_repeat_rows(tiny):
    model, params = tiny("tiny-vaswani")
    inputs, _ = _ids(model.config, [2, 5, 1])  # the shapes of a case above: no compile
    _, cache = PREFILL(model, params, (jnp.asarray(inputs),), STEPS + 1)
    rep = cache.repeat(3)
    k, rep_k = cache.self_attention[1]["k"], rep.self_attention[1]["k"]
    assert rep_k.shape[0] == 9 and rep.encoded.shape[0] == 9 and rep.lengths.shape == (9,)
    assert rep.layers[0]["cross"]["k"].shape[0] == 9
    np.testing.assert_array_equal(rep_k[3], k[1])
    back = rep.reorder(jnp.asarray([2, 0, 1, 5, 3, 4, 8, 7, 6]))
    np.testing.assert_array_equal(back.self_attention[1]["k"][0], rep_k[2])
    np.testing.assert_array_equal(back.self_attention[1]["k"][3], rep_k[5])
    assert int(back.index) == int(cache.index) == 1
