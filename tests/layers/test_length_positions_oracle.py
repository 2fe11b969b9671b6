"""The length-generalisation encodings of ``tfmjax.layers.positions`` against NumPy written
from the papers: randomized positions (Ruoss et al. 2023), Abacus places (McLeish et al.
2024), FIRE (Li et al. 2023), and the per-row T5 and ALiBi biases randomized positions need."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta

from tfmjax.layers import positions

_spec = importlib.util.spec_from_file_location(
    "tfmjax_tests_oracle", pathlib.Path(__file__).resolve().parents[1] / "oracle.py"
)
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)


def test_randomized_positions_are_sorted_distinct_and_in_range():
    """Each row's n tokens get n strictly increasing positions in [0, M); a packed row's
    second segment takes the first places of the same subset; padding reads 0."""
    index = np.array([[0, 1, 2, 3, 4, 0, 0], [0, 1, 2, 0, 1, 0, 0]])
    segments = np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 2, 2, 0, 0]])
    lengths = jnp.array([5, 3])
    for seed in range(20):
        pos = np.asarray(positions.randomized_positions(jax.random.key(seed), index, lengths, 12))
        assert np.all(np.diff(pos[0, :5]) > 0) and np.all(np.diff(pos[1, :3]) > 0)
        assert pos.min() >= 0 and pos.max() < 12
        np.testing.assert_array_equal(pos[1, 3:5], pos[1, 0:2])
        assert np.all(pos[segments == 0] == 0) or np.all(index[segments == 0] == 0)


def test_randomized_positions_are_a_uniform_subset():
    """The paper samples a uniform n-subset of [0, M): over many rows each position is
    chosen with probability n/M, and the k-th order statistic has mean (k+1)(M+1)/(n+1)-1
    (uniform subset order statistics); 4000 rows, tolerances of about 5 standard errors."""
    B, T, n, M = 4000, 6, 4, 10
    index = np.broadcast_to(np.arange(T), (B, T))
    pos = np.asarray(
        positions.randomized_positions(jax.random.key(0), index, jnp.full((B,), n), M)
    )[:, :n]
    freq = np.bincount(pos.ravel(), minlength=M) / B
    np.testing.assert_allclose(freq, n / M, atol=5 * np.sqrt(0.4 * 0.6 / B))
    expected = (np.arange(1, n + 1)) * (M + 1) / (n + 1) - 1
    np.testing.assert_allclose(pos.mean(0), expected, atol=0.15)


def test_evaluation_table_is_one_fixed_sorted_subset():
    """Evaluation reads one draw: strictly increasing, in [0, M), the same on every call; a
    longer table is another draw, not an extension (the table's size is the model's
    max_len, fixed per model)."""
    table = positions.evaluation_position_table(72, 256)
    assert table.shape == (72,) and table.dtype == np.int32
    assert np.all(np.diff(table) > 0) and table[0] >= 0 and table[-1] < 256
    np.testing.assert_array_equal(table, positions.evaluation_position_table(72, 256))
    # Typical gaps of a uniform 72-subset of 256 (mean 256/73, about 3.5), not 0..71's 1s.
    assert 2.5 < np.diff(table).mean() < 4.5 and table[-1] > 200
    np.testing.assert_array_equal(positions.evaluation_position_table(8, 8), np.arange(8))


def test_digit_runs_match_the_abacus_oracle_and_carry_across_chunks():
    rng = np.random.default_rng(0)
    ids = rng.choice([3, 5, 6, 9, 14, 15, 0], size=(5, 17))
    want = oracle.oracle_abacus_places(ids, 5)
    np.testing.assert_array_equal(np.asarray(positions.digit_runs(jnp.asarray(ids), 5)), want)
    # Token by token with the carry (as KV-cached decoding feeds them): the same places.
    carry = jnp.zeros((5,), jnp.int32)
    for t in range(ids.shape[1]):
        got = positions.digit_runs(jnp.asarray(ids[:, t : t + 1]), 5, carry)
        np.testing.assert_array_equal(np.asarray(got[:, 0]), want[:, t])
        carry = got[:, -1]


def test_digit_runs_from_each_numbers_end_match_the_oracle():
    rng = np.random.default_rng(1)
    ids = rng.choice([3, 5, 6, 9, 14, 15, 0], size=(5, 17))
    want = oracle.oracle_abacus_places(ids, 5, from_end=True)
    got = positions.digit_runs(jnp.asarray(ids), 5, from_end=True)
    np.testing.assert_array_equal(np.asarray(got), want)
    # "1 2 3 x 4 5": the first number's places 3 2 1, the second's 2 1 (place values).
    np.testing.assert_array_equal(
        oracle.oracle_abacus_places([[6, 7, 8, 3, 9, 10]], 5, from_end=True), [[3, 2, 1, 0, 2, 1]]
    )
    with pytest.raises(ValueError, match="whole input"):
        positions.digit_runs(jnp.asarray(ids), 5, jnp.zeros((5,), jnp.int32), from_end=True)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_fire_bias_matches_the_formula(bidirectional):
    module = positions.FireBias(3, 8, 6.0, bidirectional)
    q = jnp.array([[0, 2, 5, 9, 14], [3, 4, 5, 6, 7]])
    params = meta.unbox(module.init(jax.random.key(0), q, q))
    got = np.asarray(module.apply(params, q, q))
    p = jax.tree.map(np.asarray, params["params"])
    softplus = lambda x: float(np.log1p(np.exp(x)))  # noqa: E731
    assert softplus(p["c"]) == pytest.approx(0.1, rel=1e-5)
    for b in range(2):
        want = oracle.oracle_fire(
            np.asarray(q[b]),
            np.asarray(q[b]),
            softplus(p["c"]),
            softplus(p["threshold"]),
            p["fire_in"]["kernel"],
            p["fire_in"]["bias"],
            p["fire_out"]["kernel"],
            p["fire_out"]["bias"],
            bidirectional,
        )
        np.testing.assert_allclose(got[b], want, rtol=1e-5, atol=1e-6)


def test_per_row_relative_and_alibi_biases_match_the_formulas():
    q = np.array([[0, 3, 4, 9], [1, 2, 8, 20]])
    module = positions.RelativePositionBias(2, 16, 20, True)
    params = meta.unbox(module.init(jax.random.key(1), jnp.asarray(q), jnp.asarray(q)))
    table = np.asarray(params["params"]["rel_bias"])
    got = np.asarray(module.apply(params, jnp.asarray(q), jnp.asarray(q)))
    slopes = np.asarray(positions.alibi_slopes(2))
    alibi = np.asarray(positions.alibi_row_bias(jnp.asarray(slopes), q, q))
    for b in range(2):
        buckets = oracle.oracle_t5_bucket(q[b][None, :] - q[b][:, None], True, 16, 20)
        np.testing.assert_allclose(got[b], np.moveaxis(table[buckets], -1, 0), rtol=1e-6)
        distance = np.abs(q[b][:, None] - q[b][None, :])
        np.testing.assert_allclose(alibi[b], -slopes[:, None, None] * distance, rtol=1e-6)
