"""QK/OV circuits (Elhage et al. 2021) against dense NumPy and the attention module itself.

Tolerances: JAX computes in float32, the references in float64 NumPy. Products, norms and
singular values agree within 1e-5 relative (to the largest entry of the reference); eigenvalues
of a non-symmetric float32 matrix are less well conditioned, so they get 1e-4 relative to the
spectral radius.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.config import ModelConfig
from tfmjax.interp.circuits import (
    FactoredMatrix,
    attention_weights,
    composition_scores,
    copying_score,
    embedding_matrices,
    full_ov_circuit,
    full_qk_circuit,
    ov_circuit,
    qk_circuit,
)
from tfmjax.layers.attention import MultiHeadAttention
from tfmjax.models import build

TINY = ModelConfig(
    family="decoder_only",
    vocab_size=24,
    d_model=16,
    num_heads=4,
    num_kv_heads=2,
    d_ff=32,
    num_layers=3,
    max_len=16,
    position="none",
    use_bias=False,
    tie_embeddings=False,
)


def _model(cfg=TINY, seed=0):
    """The model and random normal params (std 0.3) of its init's shapes (nothing compiled)."""
    model = build(cfg)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), model.dummy_batch(1, 4))
    rng = np.random.default_rng(seed)
    return model, jax.tree.map(
        lambda s: jnp.asarray(0.3 * rng.normal(size=s.shape), s.dtype), shapes
    )


def _close(actual, desired, rtol=1e-5):
    """``actual == desired`` within ``rtol`` of the largest entry of ``desired``."""
    desired = np.asarray(desired, np.float64)
    scale = max(float(np.abs(desired).max()), 1e-30)
    np.testing.assert_allclose(np.asarray(actual, np.float64), desired, rtol=0, atol=rtol * scale)


def _replace(tree, path, value):
    """A copy of nested dicts ``tree`` with ``tree[path[0]][path[1]]... = value``."""
    if not path:
        return value
    return {**tree, path[0]: _replace(tree[path[0]], path[1:], value)}


def _f64(weights):
    return {k: np.asarray(v, np.float64) for k, v in weights.items()}


# -- FactoredMatrix ----------------------------------------------------------------------------


def test_factored_matrix_matches_dense():
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(3, 7, 4)), rng.normal(size=(3, 4, 5))  # batch 3, [7,4] @ [4,5]
    fm, dense = FactoredMatrix(jnp.asarray(A, jnp.float32), jnp.asarray(B, jnp.float32)), A @ B
    assert fm.shape == (3, 7, 5) and fm.rank == 4
    _close(fm.full(), dense)
    _close(fm.T.full(), np.swapaxes(dense, -1, -2))
    _close(fm[1].full(), dense[1])

    X, Y = rng.normal(size=(5, 6)), rng.normal(size=(2, 7))
    right, left = fm @ jnp.asarray(X, jnp.float32), jnp.asarray(Y, jnp.float32) @ fm
    assert isinstance(right, FactoredMatrix) and isinstance(left, FactoredMatrix)
    _close(right.full(), dense @ X)
    _close(left.full(), Y @ dense)

    for rank in (2, 6):  # the product keeps the smaller inner width
        C, E = rng.normal(size=(3, 5, rank)), rng.normal(size=(3, rank, 4))
        other = FactoredMatrix(jnp.asarray(C, jnp.float32), jnp.asarray(E, jnp.float32))
        prod = fm @ other
        assert prod.rank == min(4, rank)
        _close(prod.full(), dense @ (C @ E))

    _close(fm.frobenius_norm(), np.linalg.norm(dense, axis=(-2, -1)))
    U, S, Vh = fm.svd()
    assert U.shape == (3, 7, 4) and S.shape == (3, 4) and Vh.shape == (3, 4, 5)
    _close(S, np.linalg.svd(dense, compute_uv=False)[:, :4])
    _close(jnp.einsum("bmr,br,brn->bmn", U, S, Vh), dense)
    _close(jnp.swapaxes(U, -1, -2) @ U, np.broadcast_to(np.eye(4), (3, 4, 4)))


def test_factored_eigenvalues_are_the_nonzero_ones():
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(2, 9, 3)), rng.normal(size=(2, 3, 9))
    fm = FactoredMatrix(jnp.asarray(A, jnp.float32), jnp.asarray(B, jnp.float32))
    eig = np.asarray(jax.jit(FactoredMatrix.eigenvalues)(fm))  # also: a pytree through jit
    assert eig.shape == (2, 3) and np.iscomplexobj(eig)
    for b in range(2):
        dense = np.linalg.eigvals(A[b] @ B[b])
        nonzero = dense[np.argsort(-np.abs(dense))[:3]]  # the other 6 are ~1e-15
        assert np.abs(np.sort_complex(dense)[np.abs(np.sort_complex(dense)) < 1e-9]).size == 6
        radius = np.abs(nonzero).max()
        for lam in nonzero:  # every nonzero eigenvalue is found (conjugate pairs included)
            assert np.abs(eig[b] - lam).min() < 1e-4 * radius
    with pytest.raises(ValueError, match="square"):
        FactoredMatrix(jnp.ones((3, 2)), jnp.ones((2, 4))).eigenvalues()


# -- reading the weights ------------------------------------------------------------------------


def test_attention_weights_gqa_scanned_and_unrolled():
    model, params = _model()
    model_u, params_u = model.unrolled(params)
    assert "layers" in params["params"]["decoder"]
    scanned = attention_weights(model, params, "decoder", layer=2)
    unrolled = attention_weights(model_u, params_u, "decoder", layer=2)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        np.testing.assert_array_equal(scanned[name], unrolled[name])
    p = params_u["params"]["decoder"]["layer_2"]["attention"]
    assert scanned["W_Q"].shape == (4, 16, 4) and scanned["W_O"].shape == (4, 4, 16)
    for n in range(4):  # query head n reads kv head n // 2
        np.testing.assert_array_equal(scanned["W_Q"][n], p["query"]["kernel"][:, n])
        np.testing.assert_array_equal(scanned["W_K"][n], p["key"]["kernel"][:, n // 2])
        np.testing.assert_array_equal(scanned["W_V"][n], p["value"]["kernel"][:, n // 2])
        np.testing.assert_array_equal(scanned["W_O"][n], p["out"]["kernel"][n])
    assert not np.array_equal(scanned["W_K"][0], scanned["W_K"][2])  # two distinct kv heads
    with pytest.raises(ValueError, match="out of range"):
        attention_weights(model, params, "decoder", layer=3)
    with pytest.raises(ValueError, match="no 'cross_attn'"):
        attention_weights(model, params, "decoder", kind="cross_attn")


def test_circuits_reproduce_the_attention_module():
    """QK gives the module's q·k; Σ_n softmax(x QK xᵀ / sqrt(H)) x OV is its output."""
    model, params = _model()
    _, params_u = model.unrolled(params)
    layer = {"params": params_u["params"]["decoder"]["layer_1"]["attention"]}
    weights = attention_weights(model, params, "decoder", layer=1)
    qk, ov = qk_circuit(weights).full(), ov_circuit(weights).full()  # [N,D,D]
    assert qk.shape == ov.shape == (4, 16, 16)

    D, N, H, T = 16, 4, 4, 5
    x = jnp.asarray(np.random.default_rng(2).normal(size=(1, T, D)), jnp.float32)
    mha = MultiHeadAttention(D, N, 2, H, attention_bias=False, impl="reference")
    q, k = mha.apply(layer, x, method=lambda m, x: (m.query(x), m.key(x)))  # [1,T,N|K,H]
    for n in range(N):
        _close(x[0] @ qk[n] @ x[0].T, q[0, :, n] @ k[0, :, n // 2].T)

    out, _ = mha.apply(layer, x, q_positions=jnp.zeros((1, T), jnp.int32))
    logits = jnp.einsum("td,nde,se->nts", x[0], qk, x[0]) / np.sqrt(H)
    by_circuits = jnp.einsum("nts,sd,nde->te", jax.nn.softmax(logits, axis=-1), x[0], ov)
    _close(by_circuits, out[0])


def test_embedding_matrices_match_the_model():
    base = dataclasses.replace(TINY, num_layers=1, norm_position="post")  # no final norm
    ids = jnp.arange(24, dtype=jnp.int32)[None]
    for tie, scaled in ((True, True), (False, False)):
        cfg = dataclasses.replace(
            base, tie_embeddings=tie, scale_tied_output=tie and scaled, scale_embeddings=scaled
        )
        model, params = _model(cfg)
        W_E, W_U = embedding_matrices(model, params)
        assert W_E.shape == (24, 16) and W_U.shape == (16, 24)
        x = model.apply(
            params, ids, method=lambda m, ids: m.embedder(ids, 0 * ids, deterministic=True)
        )
        _close(W_E, x[0])
        logits = model.apply(params, x, method=lambda m, x: m.head(x, m.embedder))
        _close(x[0] @ W_U, logits[0])


# -- full circuits ------------------------------------------------------------------------------


def test_full_circuits_and_copying_score_match_dense():
    cfg = dataclasses.replace(TINY, scale_embeddings=True)
    model, params = _model(cfg, seed=3)
    W_E, W_U = (np.asarray(m, np.float64) for m in embedding_matrices(model, params))
    w = _f64(attention_weights(model, params, "decoder", layer=1))
    qk_dense = W_E @ w["W_Q"] @ np.swapaxes(w["W_K"], 1, 2) @ W_E.T  # [N,V,V]
    ov_dense = W_E @ w["W_V"] @ w["W_O"] @ W_U
    full_qk, full_ov = full_qk_circuit(model, params, 1), full_ov_circuit(model, params, 1)
    assert full_qk.shape == full_ov.shape == (4, 24, 24) and full_ov.rank == 4  # never V×V
    _close(full_qk.full(), qk_dense)
    _close(full_ov.full(), ov_dense)
    eig = np.linalg.eigvals(ov_dense)
    dense_score = eig.sum(-1).real / np.abs(eig).sum(-1)
    np.testing.assert_allclose(copying_score(full_ov), dense_score, atol=1e-4)
    assert np.all(np.abs(dense_score) < 1)  # a random head neither copies nor anti-copies


def test_copying_score_of_a_constructed_copying_head():
    """OV[n] = ±P_n (the projection on head n's H coordinates, D = N·H) with tied embeddings:
    the full OV circuit ±(W_E P_n)(W_E P_n)ᵀ has only nonnegative (or nonpositive) eigenvalues."""
    cfg = dataclasses.replace(TINY, num_kv_heads=None, tie_embeddings=True, num_layers=1)
    model, params = _model(cfg)
    model, params = model.unrolled(params)
    D, N, H = 16, 4, 4
    signs = np.array([1.0, -1.0, 1.0, -1.0])
    eye = np.eye(D, dtype=np.float32)
    value = np.stack([eye[:, n * H : (n + 1) * H] for n in range(N)], axis=1)  # [D,N,H]
    out = np.stack([s * eye[n * H : (n + 1) * H] for n, s in enumerate(signs)])  # [N,H,D]
    attn = ("params", "decoder", "layer_0", "attention")
    params = _replace(params, (*attn, "value", "kernel"), jnp.asarray(value))
    params = _replace(params, (*attn, "out", "kernel"), jnp.asarray(out))

    ov = ov_circuit(attention_weights(model, params)).full()
    _close(ov.sum(0), np.diag(np.repeat(signs, H)))
    np.testing.assert_allclose(copying_score(full_ov_circuit(model, params, 0)), signs, atol=1e-5)


# -- composition ------------------------------------------------------------------------------


def _dense_composition(weights_by_layer):
    """``{"q","k","v"}`` ``[L,N,L,N]`` from dense float64 matrices."""
    ws = [_f64(w) for w in weights_by_layer]
    qk = [w["W_Q"] @ np.swapaxes(w["W_K"], 1, 2) for w in ws]
    ov = [w["W_V"] @ w["W_O"] for w in ws]
    L, N = len(ws), ws[0]["W_Q"].shape[0]
    later = {"q": qk, "k": [np.swapaxes(c, 1, 2) for c in qk], "v": ov}
    out = {name: np.full((L, N, L, N), np.nan) for name in later}
    fro = lambda m: np.linalg.norm(m, axis=(-2, -1))  # noqa: E731
    for name, circuits in later.items():
        for i in range(L):
            for j in range(i + 1, L):
                for n in range(N):
                    for m in range(N):
                        a, b = ov[i][n], circuits[j][m]
                        out[name][i, n, j, m] = fro(a @ b) / (fro(a) * fro(b))
    return out


def test_composition_scores_match_dense():
    model, params = _model()
    scores = composition_scores(model, params)
    dense = _dense_composition([attention_weights(model, params, "decoder", i) for i in range(3)])
    for name in ("q", "k", "v"):
        assert scores[name].shape == (3, 4, 3, 4)
        np.testing.assert_allclose(scores[name], dense[name], rtol=1e-5)  # NaN where NaN
        later = np.arange(3)[None, :] > np.arange(3)[:, None]  # [i, j]: j after i
        assert np.all(np.isnan(scores[name]) == ~later[:, None, :, None])
        valid = np.asarray(scores[name])[~np.isnan(scores[name])]
        assert valid.size == 3 * 16 and np.all((valid > 0) & (valid <= 1))


def test_composition_zero_for_orthogonal_subspaces():
    """Layer 0 writes only to coordinates 0..7, layer 1's queries read only 8..15."""
    cfg = dataclasses.replace(TINY, num_layers=2, scan_layers=False)
    model, params = _model(cfg)
    dec = ("params", "decoder")
    out = params["params"]["decoder"]["layer_0"]["attention"]["out"]["kernel"]
    query = params["params"]["decoder"]["layer_1"]["attention"]["query"]["kernel"]
    params = _replace(
        params, (*dec, "layer_0", "attention", "out", "kernel"), out.at[..., 8:].set(0)
    )
    params = _replace(
        params, (*dec, "layer_1", "attention", "query", "kernel"), query.at[:8].set(0)
    )
    scores = composition_scores(model, params)
    assert np.all(np.asarray(scores["q"][0, :, 1]) < 1e-6)
    assert np.all(np.asarray(scores["k"][0, :, 1]) > 0.05)  # keys still read everything
    assert np.all(np.asarray(scores["v"][0, :, 1]) > 0.05)


# -- families and attention systems ------------------------------------------------------------


def test_encoder_decoder_stacks_and_cross_attention():
    cfg = dataclasses.replace(
        TINY, family="encoder_decoder", num_layers=2, num_decoder_layers=1, tie_embeddings=True
    )
    model, params = _model(cfg)
    _, params_u = model.unrolled(params)
    cross = attention_weights(model, params, "decoder", 0, kind="cross_attn")
    p = params_u["params"]["decoder"]["layer_0"]["cross_attention"]
    np.testing.assert_array_equal(cross["W_Q"][3], p["query"]["kernel"][:, 3])
    np.testing.assert_array_equal(cross["W_V"][3], p["value"]["kernel"][:, 1])
    self_attn = attention_weights(model, params, "decoder", 0)
    assert not np.array_equal(self_attn["W_Q"], cross["W_Q"])
    assert full_qk_circuit(model, params, 0, kind="cross_attn").shape == (4, 24, 24)
    enc = composition_scores(model, params, stack="encoder")
    assert enc["v"].shape == (2, 4, 2, 4) and np.all(np.isfinite(enc["v"][0, :, 1]))
    assert np.all(np.isnan(composition_scores(model, params, "decoder")["q"]))  # one layer
    with pytest.raises(ValueError, match="no 'cross_attn'"):
        attention_weights(model, params, "encoder", 0, kind="cross_attn")
    with pytest.raises(ValueError, match="not one of this model's stacks"):
        attention_weights(model, params, "middle")


@pytest.mark.parametrize(
    "system",
    [
        dict(attention="linear"),
        dict(attention="mla", num_kv_heads=None, kv_rank=8),
        dict(attention="selective_scan", num_kv_heads=None),
        dict(attention="rwkv", num_kv_heads=None, activation="relu"),
    ],
)
def test_other_attention_systems_raise(system):
    model = build(dataclasses.replace(TINY, **system))
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), model.dummy_batch(1, 4))
    for call in (
        lambda: attention_weights(model, params),
        lambda: composition_scores(model, params),
        lambda: full_ov_circuit(model, params, 0),
    ):
        with pytest.raises(ValueError, match="softmax") as info:
            call()
        assert "\n" not in str(info.value)
