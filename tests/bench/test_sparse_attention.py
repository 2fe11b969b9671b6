"""``bench/sparse_attention.py``: its ``visited`` column counts the blocks the kernel visits
(the most skipping can save), so it must order the patterns as their masks do, and a pattern
run through the bench's call must equal the dense reference. No time is asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels import blockwise, reference

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "bench_sparse", ROOT / "bench" / "sparse_attention.py"
)
sparse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sparse)


def test_visited_fractions_follow_the_patterns():
    """At T=4096 in blocks of 256: the window visits its band, global tokens add a column,
    random blocks add more, and full causal attention visits everything."""
    got = {name: sparse.visited_fraction(4096, p, 256) for name, p in sparse.PATTERNS.items()}
    assert got["causal"] == 1.0
    assert got["window"] < got["window+global"] < got["bigbird"] < 1.0
    n = 4096 // 256  # the band of a 256 window: own block and the one before
    assert got["window"] == (2 * n - 1) / (n * (n + 1) / 2)


def test_the_benched_call_equals_the_reference():
    """The bench's BigBird call (small blocks, T=512) against impl='reference'."""
    q, k, v = (
        jax.random.normal(key, (1, 512, 2, 16)) for key in jax.random.split(jax.random.key(0), 3)
    )
    pattern = sparse.PATTERNS["bigbird"]
    got = sparse.attention_fn(pattern, blockwise.BlockSizes(128, 128, 128, 128))(q, k, v)
    want = reference.attention(
        q,
        k,
        v,
        causal=True,
        q_segment_ids=None,
        kv_segment_ids=None,
        window=pattern["window"],
        alibi_slopes=None,
        bias=None,
        q_offset=0,
        scale=sparse.H**-0.5,
        global_tokens=pattern["global_tokens"],
        random_blocks=pattern["random_blocks"],
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
    assert jnp.all(jnp.isfinite(got))
