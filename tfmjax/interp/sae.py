"""A sparse autoencoder (SAE) on one layer's activations.

Following Bricken et al. 2023 ("Towards Monosemanticity") and Cunningham et al. 2023, an
overcomplete dictionary of F features is fitted to activations ``x [M, D]`` (rows are tokens,
D the layer width), in row convention with ``W_enc [D, F]``, ``b_enc [F]``, ``W_dec [F, D]``,
``b_dec [D]``::

    f  = ReLU((x - b_dec) W_enc + b_enc)                        features       [M, F]
    x̂  = f W_dec + b_dec                                        reconstruction [M, D]
    loss = mean_rows ‖x - x̂‖²  +  λ · mean_rows Σ_i f_i ‖W_dec,i‖

(``f = ReLU(W_enc (x − b_dec) + b_enc)``, ``x̂ = W_dec f + b_dec`` in column form.) The L1
penalty is weighted by each decoder row's norm so the model cannot shrink ``f`` by growing
``W_dec``; on top of that the decoder rows are renormalised to unit norm after every step, so
``‖W_dec,i‖ = 1`` on the parameters ``train_sae`` returns. λ (``l1_coeff``) is relative to the
scale of the activations: rescale the data, or λ, together.

Everything here works on plain arrays (numpy or jax); nothing depends on a model. To judge
an SAE on a model, splice ``reconstruct(params, x)`` in place of the layer's output and
compare the loss with ``loss_recovered``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = dict[str, jax.Array]


@dataclass(frozen=True)
class SAEConfig:
    """Size and training settings of a sparse autoencoder.

    num_features: F, the dictionary size (often a multiple of the layer width D).
    l1_coeff: λ, the weight of the sparsity penalty (relative to the activations' scale).
    learning_rate: Adam's step size.
    steps: optimiser steps; batch_size: rows per minibatch (drawn with replacement).
    seed: the PRNG seed for the initial directions and the minibatch draws.
    """

    num_features: int
    l1_coeff: float = 1e-3
    learning_rate: float = 1e-3
    steps: int = 1000
    batch_size: int = 256
    seed: int = 0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError (one line) on a setting that cannot work."""

        def whole(name: str, low: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < low:
                raise ValueError(f"SAEConfig.{name} must be an integer >= {low}, got {v!r}")

        whole("num_features", 1)
        whole("steps", 1)
        whole("batch_size", 1)
        whole("seed", 0)
        for name, positive in (("l1_coeff", False), ("learning_rate", True)):
            v = getattr(self, name)
            ok = (
                not isinstance(v, bool)
                and isinstance(v, int | float | np.floating | np.integer)
                and math.isfinite(v)
                and (v > 0 if positive else v >= 0)
            )
            if not ok:
                bound = "> 0" if positive else ">= 0"
                raise ValueError(f"SAEConfig.{name} must be a finite number {bound}, got {v!r}")


def _as_rows(activations, d_in: int | None = None, name: str = "activations") -> jax.Array:
    """``activations`` as a float32 jax array [M, D], or ValueError naming the shape wanted."""
    x = jnp.asarray(activations, dtype=jnp.float32)
    want = "[M, D]" if d_in is None else f"[M, {d_in}]"
    if x.ndim != 2 or x.shape[0] < 1 or (d_in is not None and x.shape[1] != d_in):
        raise ValueError(f"{name} must have shape {want} with M >= 1, got {tuple(x.shape)}")
    return x


def _lead(v: jax.Array, ndim: int) -> jax.Array:
    """A vector [K] reshaped to [1, ..., 1, K] to broadcast against an array of rank ``ndim``."""
    return v.reshape((1,) * (ndim - 1) + v.shape)


def init_sae(key: jax.Array, d_in: int, cfg: SAEConfig, activations=None) -> Params:
    """Initial parameters: W_dec [F, D] random unit-norm rows, W_enc = W_decᵀ [D, F] (tied),
    b_enc = 0 [F], and b_dec [D] = the mean of ``activations [M, d_in]`` (zero when None), so the
    encoder first sees centred data."""
    if d_in < 1:
        raise ValueError(f"d_in must be >= 1, got {d_in}")
    w_dec = jax.random.normal(key, (cfg.num_features, d_in), jnp.float32)
    w_dec = w_dec / jnp.linalg.norm(w_dec, axis=1, keepdims=True)
    if activations is None:
        b_dec = jnp.zeros((d_in,), jnp.float32)
    else:
        b_dec = jnp.mean(_as_rows(activations, d_in), axis=0)
    return {
        "W_enc": w_dec.T,
        "b_enc": jnp.zeros((cfg.num_features,), jnp.float32),
        "W_dec": w_dec,
        "b_dec": b_dec,
    }


def encode(params: Params, x) -> jax.Array:
    """Features ``f [..., F] = ReLU((x - b_dec) W_enc + b_enc)`` of activations ``x [..., D]``."""
    x = jnp.asarray(x)
    pre = (x - _lead(params["b_dec"], x.ndim)) @ params["W_enc"]
    return jax.nn.relu(pre + _lead(params["b_enc"], x.ndim))


def decode(params: Params, f) -> jax.Array:
    """Reconstruction ``x̂ [..., D] = f W_dec + b_dec`` of features ``f [..., F]``."""
    f = jnp.asarray(f)
    return f @ params["W_dec"] + _lead(params["b_dec"], f.ndim)


def reconstruct(params: Params, x) -> jax.Array:
    """``decode(params, encode(params, x))``: x [..., D] -> x̂ [..., D]."""
    return decode(params, encode(params, x))


def _normalise_decoder(params: Params) -> Params:
    w = params["W_dec"]
    return {**params, "W_dec": w / jnp.linalg.norm(w, axis=1, keepdims=True)}


def sae_loss(params: Params, x, l1_coeff: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The training loss on ``x [B, D]`` (the module doc's formula) and its parts.

    Returns ``(loss, {"mse", "sparsity", "l0"})``: mse = mean_rows ‖x − x̂‖², sparsity =
    mean_rows Σ_i f_i ‖W_dec,i‖ (so loss = mse + l1_coeff · sparsity), l0 = mean_rows #{f_i > 0}.
    """
    x = jnp.asarray(x)
    f = encode(params, x)
    x_hat = decode(params, f)
    mse = jnp.mean(jnp.sum(jnp.square(x - x_hat), axis=-1))
    norms = jnp.linalg.norm(params["W_dec"], axis=1)
    sparsity = jnp.mean(jnp.sum(f * norms[None, :], axis=-1))
    l0 = jnp.mean(jnp.sum((f > 0).astype(jnp.float32), axis=-1))
    return mse + l1_coeff * sparsity, {"mse": mse, "sparsity": sparsity, "l0": l0}


def _optimizer(cfg: SAEConfig) -> optax.GradientTransformation:
    return optax.adam(cfg.learning_rate)


@jax.jit(static_argnames=("cfg",))
def _train(params: Params, data: jax.Array, key: jax.Array, cfg: SAEConfig):
    """All ``cfg.steps`` Adam steps in one ``lax.scan``; minibatch s is drawn from
    ``fold_in(key, s)``. Returns (params, per-step {"loss", "mse", "sparsity", "l0"})."""
    opt = _optimizer(cfg)

    def step(carry, s):
        params, opt_state = carry
        rows = jax.random.randint(jax.random.fold_in(key, s), (cfg.batch_size,), 0, data.shape[0])
        (loss, parts), grads = jax.value_and_grad(sae_loss, has_aux=True)(
            params, data[rows], cfg.l1_coeff
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        params = _normalise_decoder(optax.apply_updates(params, updates))
        return (params, opt_state), {"loss": loss, **parts}

    (params, _), curves = jax.lax.scan(step, (params, opt.init(params)), jnp.arange(cfg.steps))
    return params, curves


def train_sae(activations, cfg: SAEConfig) -> tuple[Params, dict[str, np.ndarray]]:
    """Fit an SAE to ``activations [M, D]`` (numpy or jax) with Adam.

    Each step draws ``cfg.batch_size`` rows with replacement (deterministic in ``cfg.seed``),
    takes one Adam step on the module doc's loss, then renormalises the decoder rows to unit
    norm. The whole run is one jitted ``lax.scan``, so the data must fit on the device.

    Returns ``(params, history)``: params as ``init_sae``'s dict; history maps "loss", "mse",
    "sparsity" (the unweighted penalty) and "l0" (mean active features per row) to numpy
    arrays [cfg.steps], each measured on that step's minibatch before its update.
    """
    cfg.validate()
    x = _as_rows(activations)
    init_key, data_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    params = init_sae(init_key, x.shape[1], cfg, x)
    # The seed only enters through the keys: one compilation serves every seed.
    params, history = _train(params, x, data_key, replace(cfg, seed=0))
    return params, {k: np.asarray(v) for k, v in history.items()}


@jax.jit
def _chunk_stats(params: Params, x: jax.Array):
    """(Σ‖x − x̂‖², per-feature count of rows where it fires [F], Σ active features) on x [m, D]."""
    f = encode(params, x)
    err = jnp.sum(jnp.square(x - decode(params, f)))
    active = f > 0
    return err, jnp.sum(active, axis=0), jnp.sum(active)


def sae_metrics(params: Params, activations, chunk_rows: int = 8192) -> dict[str, float | int]:
    """How well ``params`` explain ``activations [M, D]``, as python numbers.

    mse: mean over rows of ‖x − x̂‖² (the loss's reconstruction term).
    fraction_variance_unexplained: Σ‖x − x̂‖² / Σ‖x − mean(x)‖² (nan for constant data).
    l0: mean number of active (f > 0) features per row.
    dead_features: features active on none of these rows; dead_fraction: that over F.
    Rows are processed ``chunk_rows`` at a time, so [M, F] is never held at once.
    """
    d_in = params["W_dec"].shape[1]
    x = np.asarray(_as_rows(activations, d_in), dtype=np.float32)
    num_features = params["W_dec"].shape[0]
    err, l0_sum = 0.0, 0
    fired = np.zeros((num_features,), np.int64)
    for start in range(0, x.shape[0], chunk_rows):
        e, counts, n = _chunk_stats(params, jnp.asarray(x[start : start + chunk_rows]))
        err += float(e)
        fired += np.asarray(counts, np.int64)
        l0_sum += int(n)
    x64 = x.astype(np.float64)
    total = float(np.sum(np.square(x64 - x64.mean(axis=0, keepdims=True))))
    dead = int(np.sum(fired == 0))
    m = x.shape[0]
    return {
        "mse": err / m,
        "fraction_variance_unexplained": err / total if total > 0 else float("nan"),
        "l0": l0_sum / m,
        "dead_features": dead,
        "dead_fraction": dead / num_features,
    }


def loss_recovered(clean_loss: float, spliced_loss: float, ablated_loss: float) -> float:
    """Fraction of the loss increase from zero-ablating the layer that the SAE recovers:
    ``(ablated − spliced) / (ablated − clean)``.

    clean_loss: the model's loss as is; spliced_loss: with the layer's activations replaced by
    the SAE's reconstruction; ablated_loss: with them replaced by zeros. 1.0 means the
    reconstruction is as good as the real activations, 0.0 no better than zeros (it can go
    below 0, or above 1). ValueError when ablating changes nothing (ablated == clean).
    """
    denom = float(ablated_loss) - float(clean_loss)
    if denom == 0:
        raise ValueError(f"ablated_loss equals clean_loss ({clean_loss}); nothing to recover")
    return (float(ablated_loss) - float(spliced_loss)) / denom
