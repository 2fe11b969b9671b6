"""The Linformer layer: its output is the kernel's on its own projections (GQA), E = F shares
one param, and what it cannot take (causal masks, rows past max_len) is refused in one line."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels.linformer import linformer_attention
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.linformer_attention import LinformerAttention

CFG = BlockConfig(
    d_model=16, num_heads=4, num_kv_heads=2, head_dim=4, d_ff=32, attention="linformer"
)
X = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 16)), jnp.float32)
POS = jnp.broadcast_to(jnp.arange(5), (2, 5))
SEG = jnp.asarray([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], jnp.int32)


def _module(**kw):
    return LinformerAttention.from_block_config(
        CFG._replace(max_len=8, linformer_rank=3, **kw), "attention"
    )


@pytest.mark.parametrize("share_kv", [False, True])
def test_the_layer_is_the_kernel_on_its_projections(share_kv):
    module = _module(linformer_share_kv=share_kv)
    params = nn.unbox(module.init(jax.random.key(0), X, q_positions=POS))
    p = params["params"]
    assert p["proj_e"].shape == (3, 8) and ("proj_f" in p) == (not share_kv)
    y, cache = module.apply(params, X, q_positions=POS, kv_segment_ids=SEG)
    assert cache is None
    dense = lambda n: jnp.einsum("BTD,DKH->BTKH", X, p[n]["kernel"]) + p[n]["bias"][None, None]  # noqa: E731
    f = p["proj_e"] if share_kv else p["proj_f"]
    z = linformer_attention(
        dense("query"), dense("key"), dense("value"), p["proj_e"], f, mask=SEG != 0
    )
    want = jnp.einsum("BTNH,NHD->BTD", z, p["out"]["kernel"]) + p["out"]["bias"][None, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_what_it_cannot_take_is_refused_in_one_line():
    module = _module()
    params = module.init(jax.random.key(0), X, q_positions=POS)
    long = jnp.ones((1, 9, 16))
    for call, match in (
        (lambda: module.apply(params, X, q_positions=POS, causal=True), "no causal form"),
        (
            lambda: module.apply(params, long, q_positions=jnp.arange(9)[None]),
            "at most model.max_len=8 positions, got a row of 9",
        ),
    ):
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)
