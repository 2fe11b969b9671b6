"""The sparse autoencoder: forward pass against numpy, metrics against hand counts, training
on data made of known sparse features, determinism, config checks, loss_recovered."""

import jax
import numpy as np
import pytest

from tfmjax.interp.sae import (
    SAEConfig,
    decode,
    encode,
    init_sae,
    loss_recovered,
    reconstruct,
    sae_loss,
    sae_metrics,
    train_sae,
)

D, G, F = 16, 32, 64  # width, ground-truth features, SAE features


def sparse_data(seed: int = 0, rows: int = 4096, active: int = 2):
    """Rows [rows, D], each the sum of ``active`` of G random unit directions [G, D] with
    coefficients in [0.5, 1.5]; returns (rows, directions)."""
    r = np.random.default_rng(seed)
    dirs = r.normal(size=(G, D))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    idx = np.argsort(r.random((rows, G)), axis=1)[:, :active]
    coef = r.uniform(0.5, 1.5, size=(rows, active))
    return np.einsum("mk,mkd->md", coef, dirs[idx]).astype(np.float32), dirs


def random_params(seed: int = 0, d: int = 5, f: int = 7):
    r = np.random.default_rng(seed)
    return {
        "W_enc": r.normal(size=(d, f)).astype(np.float32),
        "b_enc": r.normal(size=(f,)).astype(np.float32),
        "W_dec": r.normal(size=(f, d)).astype(np.float32),
        "b_dec": r.normal(size=(d,)).astype(np.float32),
    }


def np_forward(p, x):
    f = np.maximum((x - p["b_dec"]) @ p["W_enc"] + p["b_enc"], 0.0)
    return f, f @ p["W_dec"] + p["b_dec"]


TRAIN_CFG = SAEConfig(
    num_features=F, l1_coeff=0.3, learning_rate=1e-2, steps=600, batch_size=256, seed=0
)


@pytest.fixture(scope="module")
def trained():
    x, dirs = sparse_data()
    params, history = train_sae(x, TRAIN_CFG)
    return x, dirs, params, history


def test_trained_sae_reconstructs_sparsely_and_finds_the_features(trained):
    x, dirs, params, history = trained
    m = sae_metrics(params, x)
    assert m["fraction_variance_unexplained"] < 0.1, m
    assert m["l0"] < F / 4, m
    loss = history["loss"]
    assert set(history) == {"loss", "mse", "sparsity", "l0"}
    assert loss.shape == (TRAIN_CFG.steps,) and np.all(np.isfinite(loss))
    thirds = [t.mean() for t in np.array_split(loss, 3)]
    assert thirds[0] > thirds[1] > thirds[2]
    assert loss[-50:].mean() < 0.2 * loss[0]
    assert history["mse"][-50:].mean() < history["mse"][:50].mean()
    # Most ground-truth directions have a decoder row pointing the same way.
    cos = dirs @ np.asarray(params["W_dec"]).T
    assert (cos.max(axis=1) > 0.9).mean() >= 0.8


def test_decoder_rows_are_unit_norm_after_training(trained):
    params = trained[2]
    assert params["W_dec"].shape == (F, D) and params["W_enc"].shape == (D, F)
    np.testing.assert_allclose(np.linalg.norm(params["W_dec"], axis=1), 1.0, atol=1e-5)


def test_init_is_tied_with_unit_rows_and_mean_decoder_bias():
    x = np.random.default_rng(1).normal(size=(50, 6)).astype(np.float32) + 3.0
    p = init_sae(jax.random.PRNGKey(0), 6, SAEConfig(num_features=10), x)
    np.testing.assert_allclose(np.linalg.norm(p["W_dec"], axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(p["W_enc"], np.asarray(p["W_dec"]).T)
    np.testing.assert_array_equal(p["b_enc"], np.zeros(10))
    np.testing.assert_allclose(p["b_dec"], x.mean(axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match=r"\[M, 7\]"):
        init_sae(jax.random.PRNGKey(0), 7, SAEConfig(num_features=10), x)


def test_encode_decode_reconstruct_match_numpy():
    p = random_params()
    x = np.random.default_rng(2).normal(size=(9, 5)).astype(np.float32)
    f_np, x_hat_np = np_forward(p, x)
    assert (f_np == 0).any() and (f_np > 0).any()  # the ReLU is exercised both ways
    np.testing.assert_allclose(encode(p, x), f_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decode(p, f_np), x_hat_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reconstruct(p, x), x_hat_np, rtol=1e-5, atol=1e-5)
    # Leading dimensions are carried through ([B, T, D] activations).
    x3 = x[:8].reshape(2, 4, 5)
    np.testing.assert_allclose(encode(p, x3), f_np[:8].reshape(2, 4, 7), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        reconstruct(p, x3), x_hat_np[:8].reshape(2, 4, 5), rtol=1e-5, atol=1e-5
    )


def test_loss_matches_numpy_with_decoder_norms():
    p = random_params(5)  # decoder rows far from unit norm: the penalty must weigh them
    x = np.random.default_rng(6).normal(size=(11, 5)).astype(np.float32)
    f, x_hat = np_forward(p, x)
    mse = np.sum((x - x_hat) ** 2, axis=1).mean()
    sparsity = (f * np.linalg.norm(p["W_dec"], axis=1)).sum(axis=1).mean()
    loss, parts = sae_loss(p, x, 0.3)
    assert float(parts["mse"]) == pytest.approx(mse, rel=1e-5)
    assert float(parts["sparsity"]) == pytest.approx(sparsity, rel=1e-5)
    assert float(parts["l0"]) == pytest.approx((f > 0).sum(axis=1).mean())
    assert float(loss) == pytest.approx(mse + 0.3 * sparsity, rel=1e-5)


def test_metrics_count_dead_features_and_match_numpy_formulas():
    p = random_params(3)
    p["b_enc"][[2, 5]] = -1e4  # features 2 and 5 can never fire on these inputs
    # Feature 0 reads x[:, 0] alone and fires only above 10: on row 117 and nowhere else.
    p["W_enc"][:, 0], p["b_dec"][0], p["b_enc"][0] = np.eye(5)[0], 0.0, -10.0
    x = np.random.default_rng(4).normal(size=(200, 5)).astype(np.float32)
    x[117, 0] = 20.0
    f, x_hat = np_forward(p, x)
    assert np.flatnonzero(f[:, 0] > 0).tolist() == [117]
    m = sae_metrics(p, x, chunk_rows=64)  # several chunks, the last one short
    assert m["dead_features"] == int(np.sum((f > 0).sum(axis=0) == 0)) == 2
    assert m["dead_fraction"] == pytest.approx(2 / 7)
    assert m["l0"] == pytest.approx((f > 0).sum(axis=1).mean())
    err = np.sum((x - x_hat) ** 2)
    assert m["mse"] == pytest.approx(err / 200, rel=1e-5)
    fvu = err / np.sum((x - x.mean(axis=0)) ** 2)
    assert m["fraction_variance_unexplained"] == pytest.approx(fvu, rel=1e-5)
    assert all(type(v) in (int, float) for v in m.values())
    assert type(m["dead_features"]) is int


def test_training_is_deterministic_for_a_seed_and_draws_fresh_minibatches():
    x, _ = sparse_data(seed=7, rows=1024, active=1)
    cfg = SAEConfig(num_features=32, l1_coeff=0.1, learning_rate=1e-2, steps=200, batch_size=4)
    (p1, h1), (p2, h2) = train_sae(x, cfg), train_sae(x, cfg)
    for k in p1:
        np.testing.assert_array_equal(p1[k], p2[k])
    np.testing.assert_array_equal(h1["loss"], h2["loss"])
    p3, _ = train_sae(x, SAEConfig(**{**cfg.__dict__, "seed": 4}))
    assert not np.array_equal(p1["W_dec"], p3["W_dec"])
    # 4 rows a step only explain all 32 directions if each step draws different rows.
    assert sae_metrics(p1, x)["fraction_variance_unexplained"] < 0.5


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_features", 0),
        ("num_features", 2.5),
        ("l1_coeff", -0.1),
        ("l1_coeff", float("nan")),
        ("learning_rate", 0.0),
        ("learning_rate", float("inf")),
        ("steps", 0),
        ("batch_size", 0),
        ("seed", -1),
        ("steps", True),
    ],
)
def test_bad_configs_raise(field, value):
    kwargs = {"num_features": 8, field: value}
    with pytest.raises(ValueError, match=field) as err:
        SAEConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_bad_activations_raise():
    with pytest.raises(ValueError, match=r"\[M, D\]"):
        train_sae(np.zeros((4, 3, 2)), SAEConfig(num_features=4, steps=1))
    with pytest.raises(ValueError, match=r"\[M, 5\]"):
        sae_metrics(random_params(), np.zeros((4, 6)))


def test_loss_recovered():
    assert loss_recovered(2.0, 2.0, 5.0) == 1.0
    assert loss_recovered(2.0, 5.0, 5.0) == 0.0
    assert loss_recovered(2.0, 3.0, 6.0) == pytest.approx(0.75)
    assert loss_recovered(2.0, 7.0, 6.0) == pytest.approx(-0.25)  # worse than ablation
    with pytest.raises(ValueError):
        loss_recovered(2.0, 3.0, 2.0)
