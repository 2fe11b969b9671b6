"""``tfmjax.layers.positions`` against the independent NumPy oracles of ``tests/oracle.py``:
T5 relative buckets (values and the per-head bias module), sinusoidal encodings, RoPE, and
the ALiBi slopes formula."""

import importlib.util
import math
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers import positions

_spec = importlib.util.spec_from_file_location(
    "tfmjax_tests_oracle", pathlib.Path(__file__).resolve().parents[1] / "oracle.py"
)
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)

BUCKET_SETTINGS = [
    (True, 32, 128),  # T5's defaults
    (False, 32, 128),  # T5 decoder self-attention
    (True, 16, 20),
    (False, 8, 16),
    (True, 64, 256),
]


def test_oracle_t5_bucket_hand_values():
    """The oracle itself on values worked out by hand from the T5 formula (32 buckets,
    max_distance 128): bidirectional halves of 16, 8 exact, then log-spaced."""
    rel = np.array([0, -1, -7, -8, -15, -16, -31, -32, -127, -128, -1000, 1, 7, 8, 16, 1000])
    want = [0, 1, 7, 8, 9, 10, 11, 12, 15, 15, 15, 17, 23, 24, 26, 31]
    np.testing.assert_array_equal(oracle.oracle_t5_bucket(rel, True, 32, 128), want)
    # Unidirectional: keys after the query share bucket 0; 16 exact, then log-spaced.
    rel = np.array([5, 1, 0, -1, -15, -16, -32, -64, -127, -128, -500])
    want = [0, 0, 0, 1, 15, 16, 21, 26, 31, 31, 31]
    np.testing.assert_array_equal(oracle.oracle_t5_bucket(rel, False, 32, 128), want)


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance", BUCKET_SETTINGS)
def test_relative_bucket_matches_oracle(bidirectional, num_buckets, max_distance):
    rel = np.arange(-3 * max_distance, 3 * max_distance + 1)
    got = positions.relative_bucket(
        jnp.asarray(rel),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    want = oracle.oracle_t5_bucket(rel, bidirectional, num_buckets, max_distance)
    mismatch = np.nonzero(np.asarray(got) != want)[0]
    assert mismatch.size == 0, (
        f"relative positions {rel[mismatch][:10].tolist()}: got "
        f"{np.asarray(got)[mismatch][:10].tolist()}, want {want[mismatch][:10].tolist()}"
    )


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_bias_module_matches_oracle(bidirectional):
    """``RelativePositionBias`` = its table looked up at the oracle's buckets, ``[1,N,T,S]``,
    with ``key_pos - query_pos`` as the relative position (decoding offsets included)."""
    N, num_buckets, max_distance = 3, 16, 24
    module = positions.RelativePositionBias(
        num_heads=N,
        num_buckets=num_buckets,
        max_distance=max_distance,
        bidirectional=bidirectional,
    )
    q_pos = jnp.arange(5) + 30  # queries at 30..34, keys at 0..39
    kv_pos = jnp.arange(40)
    params = nn.unbox(module.init(jax.random.key(0), q_pos, kv_pos))
    got = np.asarray(module.apply(params, q_pos, kv_pos))
    table = np.asarray(params["params"]["rel_bias"])  # [buckets, N]
    rel = np.asarray(kv_pos)[None, :] - np.asarray(q_pos)[:, None]
    buckets = oracle.oracle_t5_bucket(rel, bidirectional, num_buckets, max_distance)
    want = np.stack([table[buckets, n] for n in range(N)])[None]
    assert got.shape == (1, N, 5, 40)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", ["interleaved", "half_split"])
@pytest.mark.parametrize("D", [8, 12, 7])
def test_sinusoidal_matches_oracle(D, layout):
    pos = np.array([[0, 1, 2, 5, 17, 63], [3, 3, 0, 40, 9, 1]])
    got = positions.sinusoidal(jnp.asarray(pos), D, layout=layout)
    assert got.shape == (2, 6, D)
    want = oracle.oracle_sinusoidal(pos, D, layout=layout)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


@pytest.mark.parametrize("layout", ["interleaved", "half_split"])
@pytest.mark.parametrize("H", [2, 8])
def test_rope_matches_oracle(H, layout):
    """Pairs ``(x[2i], x[2i+1])`` or ``(x[i], x[i + H/2])``, as ``apply_rope`` documents."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, H)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 30, 31, 0, 63]])
    got = positions.apply_rope(jnp.asarray(x), jnp.asarray(pos), layout=layout)
    want = oracle.oracle_rope(x, pos, layout=layout)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
    # RoPE is a rotation: norms of every pair are kept, and relative positions are what
    # <q, k> sees.
    np.testing.assert_allclose(
        np.linalg.norm(np.asarray(got), axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5
    )


def test_oracle_rope_is_relative():
    """``<rope(q, p), rope(k, s)>`` depends on ``p - s`` only (checks the oracle itself)."""
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 1, 1, 8))

    def dot(p, s):
        rq = oracle.oracle_rope(q, np.array([[p]]))
        rk = oracle.oracle_rope(k, np.array([[s]]))
        return float(np.sum(rq * rk))

    assert dot(5, 2) == pytest.approx(dot(13, 10), abs=1e-10)
    assert dot(0, 0) == pytest.approx(float(np.sum(q * k)), abs=1e-12)


@pytest.mark.parametrize("N", [4, 8, 12])
def test_alibi_slopes_formula(N):
    """Press et al. 2022: ``m_h = 2^(-8h/N)``, h = 1..N (a geometric sequence from 2^(-8/N))."""
    want = [2.0 ** (-8.0 * h / N) for h in range(1, N + 1)]
    got = np.asarray(positions.alibi_slopes(N))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert math.isclose(want[-1], 2.0**-8)


def test_learned_positions_look_up_rows():
    """``LearnedPositions`` returns row ``positions[b, t]`` of its ``[max_len, D]`` table."""
    module = positions.LearnedPositions(max_len=9, d_model=4)
    pos = jnp.array([[0, 8, 3], [5, 5, 1]])
    params = nn.unbox(module.init(jax.random.key(0), pos))
    table = np.asarray(params["params"]["pos_embedding"])
    assert table.shape == (9, 4)
    np.testing.assert_array_equal(np.asarray(module.apply(params, pos)), table[np.asarray(pos)])


def test_position_tables_start_at_std_002():
    """Learned positions (GPT-2, BERT) and T5's bias table start as N(0, 0.02^2)."""
    pos = jnp.zeros((1, 1), jnp.int32)
    learned = positions.LearnedPositions(max_len=512, d_model=64).init(jax.random.key(1), pos)
    bias = positions.RelativePositionBias(
        num_heads=64, num_buckets=256, max_distance=512, bidirectional=True
    ).init(jax.random.key(2), jnp.arange(2), jnp.arange(2))
    learned, bias = nn.unbox((learned, bias))  # drop the logical axis names
    for table in (learned["params"]["pos_embedding"], bias["params"]["rel_bias"]):
        assert float(jnp.std(table)) == pytest.approx(0.02, rel=0.05)
        assert abs(float(jnp.mean(table))) < 0.002
