"""The table of self-attention variants: each entry builds from a block config and owns its
decoding cache (``init_cache``, ``cache_bytes``)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from tfmjax.layers.attention_variants import (
    ATTENTION_NAMES,
    ATTENTION_VARIANTS,
    BIDIRECTIONAL_ONLY,
)
from tfmjax.layers.block_config import BlockConfig

CFG = BlockConfig(d_model=16, num_heads=4, num_kv_heads=2, head_dim=4, d_ff=32, kv_rank=8)


def test_names_are_the_table_keys():
    assert (
        ATTENTION_NAMES
        == tuple(ATTENTION_VARIANTS)
        == (
            "softmax",
            "mla",
            "linear",
            "retention",
            "selective_scan",
            "rwkv",
            "nystrom",
            "linformer",
            "lsh",
        )
    )


@pytest.mark.parametrize("name", [n for n in ATTENTION_NAMES if n not in BIDIRECTIONAL_ONLY])
def test_variant_builds_and_its_cache_bytes_match_its_cache(name):
    cfg = CFG._replace(attention=name)
    variant = ATTENTION_VARIANTS[name]
    module = variant.from_block_config(cfg, "attention")
    assert isinstance(module, variant) and module.name == "attention"
    assert "qk_ov_circuits" not in {f.name for f in dataclasses.fields(variant)}
    x, positions = jnp.ones((2, 3, 16)), jnp.broadcast_to(jnp.arange(3), (2, 3))
    cache = variant.init_cache(cfg, 2, 5)
    ones = jnp.ones((2, 3), jnp.int32)
    kw = dict(q_positions=positions, causal=True)  # retention, selective_scan: causal only
    params = module.init(jax.random.key(0), x, **kw)
    y, cache = module.apply(params, x, **kw, q_segment_ids=ones, cache=cache)
    assert y.shape == x.shape and int(cache["index"]) == 3
    arrays = {k: v for k, v in cache.items() if k not in ("segment_ids", "index")}
    assert sum(a.nbytes for a in arrays.values()) == variant.cache_bytes(cfg, 2, 1, 5)


@pytest.mark.parametrize("name", BIDIRECTIONAL_ONLY)
def test_bidirectional_only_variant_builds_and_refuses_decoding(name):
    """No causal form, so no cache: a decoder keeps softmax (tfmjax.models.common)."""
    cfg = CFG._replace(attention=name, num_landmarks=2, max_len=5, linformer_rank=2)
    variant = ATTENTION_VARIANTS[name]
    module = variant.from_block_config(cfg, "attention")
    assert isinstance(module, variant) and variant.bidirectional_only
    x, positions = jnp.ones((2, 3, 16)), jnp.broadcast_to(jnp.arange(3), (2, 3))
    params = module.init(jax.random.key(0), x, q_positions=positions)
    y, cache = module.apply(params, x, q_positions=positions)
    assert y.shape == x.shape and cache is None
    for refused in (
        lambda: variant.init_cache(cfg, 2, 5),
        lambda: variant.cache_bytes(cfg, 2, 1, 5),
    ):
        with pytest.raises(ValueError, match=f"model.attention={name!r} is bidirectional only"):
            refused()
    with pytest.raises(ValueError, match="no causal form"):
        module.apply(params, x, q_positions=positions, causal=True)
