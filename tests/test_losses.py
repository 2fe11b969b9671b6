"""Losses and metrics against hand computations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax import losses as L

# B=2, T=3, V=4, written out by hand.
LOGITS = np.array(
    [
        [[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 3.0, 0.5, 0.0]],
        [[-2.0, 0.0, 4.0, 1.0], [0.5, 0.5, 2.0, 0.5], [9.0, 9.0, 9.0, 9.0]],
    ],
    np.float32,
)
TARGETS = np.array([[0, 3, 1], [2, 1, 0]], np.int32)
MASK = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], np.float32)


def np_token_loss(logits_row, target, eps):
    """-sum_v q_v log p_v with q = (1 - eps) onehot + eps / V, via explicit loops."""
    v = len(logits_row)
    lse = math.log(sum(math.exp(x) for x in logits_row))
    total = 0.0
    for k in range(v):
        q = (1 - eps) * (k == target) + eps / v
        total -= q * (logits_row[k] - lse)
    return total


def np_loss_sum(eps):
    return sum(
        np_token_loss(LOGITS[b, t], TARGETS[b, t], eps) * MASK[b, t]
        for b in range(2)
        for t in range(3)
    )


def test_cross_entropy_hand_values_v3():
    logits = jnp.array([[[0.0, math.log(2.0), math.log(5.0)]]])  # softmax = (1, 2, 5) / 8
    targets = jnp.array([[1]])
    loss, w = L.cross_entropy(logits, targets, jnp.ones((1, 1)))
    assert float(loss) == pytest.approx(-math.log(2 / 8), rel=1e-6)
    assert float(w) == 1.0
    eps = 0.3
    # q = (0.1, 0.8, 0.1)
    want = -(0.1 * math.log(1 / 8) + 0.8 * math.log(2 / 8) + 0.1 * math.log(5 / 8))
    loss, _ = L.cross_entropy(logits, targets, jnp.ones((1, 1)), label_smoothing=eps)
    assert float(loss) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_cross_entropy_matches_numpy(eps):
    loss, w = L.cross_entropy(jnp.asarray(LOGITS), jnp.asarray(TARGETS), jnp.asarray(MASK), eps)
    assert float(loss) == pytest.approx(np_loss_sum(eps), rel=1e-5)
    assert float(w) == 5.0
    assert loss.dtype == jnp.float32


def test_cross_entropy_eps0_equals_optax():
    logits = jax.random.normal(jax.random.key(0), (3, 5, 11)) * 3
    targets = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
    mask = (jax.random.uniform(jax.random.key(2), (3, 5)) > 0.3).astype(jnp.float32)
    loss, w = L.cross_entropy(logits, targets, mask)
    ref = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    np.testing.assert_allclose(loss, jnp.sum(ref * mask), rtol=1e-5)
    np.testing.assert_allclose(w, jnp.sum(mask))


def test_cross_entropy_eps_matches_optax_smooth_labels():
    eps, v = 0.1, 11
    logits = jax.random.normal(jax.random.key(3), (2, 4, v))
    targets = jax.random.randint(jax.random.key(4), (2, 4), 0, v)
    mask = jnp.ones((2, 4))
    loss, _ = L.cross_entropy(logits, targets, mask, label_smoothing=eps)
    q = optax.smooth_labels(jax.nn.one_hot(targets, v), eps)
    np.testing.assert_allclose(loss, jnp.sum(optax.softmax_cross_entropy(logits, q)), rtol=1e-5)


def test_masked_positions_contribute_nothing():
    base = L.cross_entropy(jnp.asarray(LOGITS), jnp.asarray(TARGETS), jnp.asarray(MASK), 0.1)
    logits = LOGITS.copy()
    logits[1, 2] = [np.inf, -np.inf, np.nan, 1e30]  # masked position
    targets = TARGETS.copy()
    targets[1, 2] = -1  # padding id out of range
    for fn in (
        lambda lg, tg: L.cross_entropy(lg, tg, jnp.asarray(MASK), 0.1),
        lambda lg, tg: L.token_accuracy(lg, tg, jnp.asarray(MASK)),
    ):
        got = fn(jnp.asarray(logits), jnp.asarray(targets))
        want = fn(jnp.asarray(LOGITS), jnp.asarray(TARGETS))
        np.testing.assert_array_equal(got, want)
    got = L.cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(MASK), 0.1)
    np.testing.assert_array_equal(got, base)


def test_cross_entropy_bf16_logits_and_jit():
    """bf16 logits are upcast, not computed in bf16: every logit here is exact in bf16, so the
    jitted loss is the float64 hand computation to float32 rounding."""
    assert np.array_equal(np.asarray(jnp.asarray(LOGITS, jnp.bfloat16), np.float32), LOGITS)
    f = jax.jit(L.cross_entropy, static_argnums=3)
    for eps in (0.0, 0.1):
        bf16 = jnp.asarray(LOGITS, jnp.bfloat16)
        loss, _ = f(bf16, jnp.asarray(TARGETS), jnp.asarray(MASK), eps)
        assert loss.dtype == jnp.float32
        assert float(loss) == pytest.approx(np_loss_sum(eps), rel=1e-6)


@pytest.mark.parametrize("v,eps", [(4, 0.0), (4, 0.1), (1000, 0.1), (32000, 0.2)])
def test_smoothed_loss_floor_is_min_loss(v, eps):
    q = np.full(v, eps / v)
    q[0] += 1 - eps
    entropy = -sum(x * math.log(x) for x in q if x > 0)
    assert L.smoothed_loss_floor(v, eps) == pytest.approx(entropy, rel=1e-9)
    # Logits = log q (the optimum) reach the floor.
    logits = jnp.log(jnp.asarray(q, jnp.float32))[None, None]
    loss, _ = L.cross_entropy(logits, jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1)), eps)
    assert float(loss) == pytest.approx(entropy, rel=1e-4, abs=1e-6)


def test_token_accuracy_hand_example():
    # argmax: [[0, 0, 1], [2, 2, 0]]; targets [[0, 3, 1], [2, 1, 0]]; last one masked.
    correct, w = L.token_accuracy(jnp.asarray(LOGITS), jnp.asarray(TARGETS), jnp.asarray(MASK))
    assert (float(correct), float(w)) == (3.0, 5.0)


def test_sequence_exact_match_hand_example():
    preds = jnp.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]])
    targets = jnp.array([[1, 2, 3], [4, 5, 0], [7, 0, 9], [2, 2, 2]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]], jnp.float32)
    # row 0 exact; row 1 exact (mismatch masked); row 2 wrong; row 3 empty, not counted.
    exact, n = L.sequence_exact_match(preds, targets, mask)
    assert (int(exact), int(n)) == (2, 3)
    logits = jax.nn.one_hot(preds, 10) * 5.0
    assert tuple(map(int, L.sequence_exact_match(logits, targets, mask))) == (2, 3)
    # Shared example: both rows have an unmasked wrong argmax at t=1.
    exact, n = L.sequence_exact_match(jnp.asarray(LOGITS), jnp.asarray(TARGETS), jnp.asarray(MASK))
    assert (int(exact), int(n)) == (0, 2)


def test_shape_and_arg_errors():
    lg, tg, mk = jnp.asarray(LOGITS), jnp.asarray(TARGETS), jnp.asarray(MASK)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        L.cross_entropy(lg, tg, mk, label_smoothing=1.0)
    with pytest.raises(ValueError, match="mask must have shape"):
        L.cross_entropy(lg, tg, mk[:, :2])
    with pytest.raises(ValueError, match="logits must have shape"):
        L.token_accuracy(lg[:, :2], tg, mk)
    with pytest.raises(ValueError, match="logits_or_predictions"):
        L.sequence_exact_match(tg[:, :2], tg, mk)


def test_cross_entropy_weights_tokens_by_the_mask():
    """The mask is a weight, not only a switch: ``loss_sum = sum(loss * mask)``."""
    weights = np.array([[0.5, 2.0, 1.0], [0.25, 1.0, 0.0]], np.float32)
    loss, w = L.cross_entropy(jnp.asarray(LOGITS), jnp.asarray(TARGETS), jnp.asarray(weights))
    want = sum(
        np_token_loss(LOGITS[b, t], TARGETS[b, t], 0.0) * weights[b, t]
        for b in range(2)
        for t in range(3)
    )
    assert float(loss) == pytest.approx(want, rel=1e-6)
    assert float(w) == pytest.approx(weights.sum(), rel=1e-7)


@pytest.mark.parametrize(
    "vocab_size, label_smoothing",
    [(10, 1.0), (10, -0.1), (10, float("nan")), (10, "0.1"), (0, 0.1), (True, 0.1), (3.0, 0.1)],
)
def test_smoothed_loss_floor_refuses_bad_arguments(vocab_size, label_smoothing):
    """eps must be a real number in [0, 1), V an int >= 1 (not a bool or a float)."""
    with pytest.raises(ValueError, match="must be") as e:
        L.smoothed_loss_floor(vocab_size, label_smoothing)
    assert "\n" not in str(e.value)


def test_smoothed_loss_floor_edges():
    """V = 1: the smoothed target is the one-hot itself, entropy 0; eps = 0: entropy 0."""
    assert L.smoothed_loss_floor(1, 0.5) == 0.0
    assert L.smoothed_loss_floor(7, 0.0) == 0.0
