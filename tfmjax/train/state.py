"""The training state: one plain pytree that a checkpoint holds whole.

``TrainState`` fields (all JAX arrays, so the state checkpoints and donates as is):
  step     int32 []      updates done; batch ``step`` and key ``fold_in(root, step)`` come next
  params   pytree        float32 model parameters (compute dtype is ``model.dtype``)
  opt_state pytree       the Optax state
  rng      uint32 [2]    root key as raw key data (``jax.random.key_data``), so it checkpoints
  window   dict          running sums of the current log window (see ``WINDOW_KEYS``, and
                         ``moe_*_sum`` for a mixture of experts: ``sum_keys``); part of
                         the state so a resumed run logs exactly the numbers an uninterrupted
                         run logs, even when it resumes in the middle of a window
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from tfmjax.parallel import with_shardings

# Running sums since the last log step. Counts of tokens and sequences are float32 so a
# window of any length fits; ``first_nonfinite`` is -1 until a step has a non-finite loss.
# ``SUM_KEYS`` are the per-batch sums a train step adds (see tfmjax.train.step.batch_sums).
SUM_KEYS = ("loss_sum", "nll_sum", "tokens", "correct", "exact", "sequences")
WINDOW_KEYS = ("steps", *SUM_KEYS, "grad_norm_sum", "nonfinite", "first_nonfinite", "learning_rate")


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    window: dict

    @property
    def root_key(self) -> jax.Array:
        """The root PRNG key (typed) rebuilt from the raw ``rng`` data."""
        return jax.random.wrap_key_data(self.rng)


AUX_PREFIX = "moe_"  # the window sums of a model's auxiliary metrics (aux_metric_names)


def sum_keys(model) -> tuple[str, ...]:
    """The per-batch sums a train step of ``model`` adds: :data:`SUM_KEYS` and, for a model
    with auxiliary metrics (mixture of experts), ``<name>_sum`` of each, token-weighted."""
    return SUM_KEYS + tuple(f"{name}_sum" for name in model.aux_metric_names)


def empty_window(keys=WINDOW_KEYS) -> dict:
    """A fresh log window of ``keys`` (default :data:`WINDOW_KEYS`; a model with auxiliary
    metrics adds their sums): zeros, and ``first_nonfinite = -1``."""
    window = {key: jnp.zeros((), jnp.float32) for key in keys}
    window["first_nonfinite"] = jnp.full((), -1, jnp.int32)
    return window


def init_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """``(init_key, root_key)`` for parameter initialisation and the per-step dropout keys."""
    init_key, root_key = jax.random.split(jax.random.key(seed))
    return init_key, root_key


def create_state(
    model, tx: optax.GradientTransformation, sample_batch: dict, seed: int, shardings=None
) -> TrainState:
    """A fresh state: ``model.init`` on ``sample_batch``, ``tx.init``, step 0, empty window.

    Jitted: one compile is far cheaper than running the init op by op. With ``shardings``
    (a tree like the state, :func:`state_shardings`), every array is created directly with
    its sharding.
    """
    create = functools.partial(_create, model, tx, seed=seed)
    return jax.jit(create, out_shardings=shardings)(sample_batch)


def state_shardings(model, tx, sample_batch: dict, seed: int, placement) -> TrainState:
    """The sharding of every leaf of the state on ``placement``'s mesh."""
    abstract = abstract_state(model, tx, sample_batch, seed)
    return placement.state(abstract, placement.params(model, sample_batch))


def _create(model, tx, sample_batch: dict, seed: int) -> TrainState:
    init_key, root_key = init_keys(seed)
    params = model.init({"params": init_key}, sample_batch)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(root_key),
        window=empty_window(WINDOW_KEYS + sum_keys(model)[len(SUM_KEYS) :]),
    )


def abstract_state(
    model, tx: optax.GradientTransformation, sample_batch: dict, seed: int, shardings=None
) -> TrainState:
    """Shapes and dtypes of :func:`create_state` (no memory, no compute), with ``shardings``
    (a tree like the state) if given: a restore target."""
    abstract = jax.eval_shape(functools.partial(_create, model, tx, seed=seed), sample_batch)
    return abstract if shardings is None else with_shardings(abstract, shardings)


def reset_window(state: TrainState, shardings=None) -> TrainState:
    """``state`` with an empty log window (after the loop has logged the current one), laid
    out as ``shardings`` (a window of shardings; needed when the mesh spans processes)."""
    window = empty_window(tuple(state.window))
    if shardings is not None:
        window = jax.device_put(jax.device_get(window), shardings)
    return state.replace(window=window)


def saved_optimizer(tx) -> optax.GradientTransformation:
    """The optimizer whose state layout checkpoints hold: ``tx`` itself, or the Optax twin of
    a :class:`tfmjax.train.fused_adamw.FusedAdamW`."""
    return getattr(tx, "saved", tx)


def to_saved(state: TrainState, tx) -> TrainState:
    """``state`` with its optimizer state in the layout checkpoints hold (exact)."""
    if not hasattr(tx, "to_saved"):
        return state
    return state.replace(opt_state=tx.to_saved(state.opt_state, state.params))


def from_saved(state: TrainState, tx) -> TrainState:
    """Inverse of :func:`to_saved`: a restored state with ``tx``'s own optimizer layout."""
    if not hasattr(tx, "from_saved"):
        return state
    return state.replace(opt_state=tx.from_saved(state.opt_state, state.params))


def count_params(params: Any) -> int:
    """Number of parameters in a pytree."""
    return sum(int(x.size) for x in jax.tree.leaves(params))


def with_params_from(state: TrainState, directory: str, tx: optax.GradientTransformation):
    """``state`` with the params of the checkpoint under ``directory`` (``train.init_from``)
    and a fresh optimizer state for them; ConfigError (one line) if they do not fit."""
    from tfmjax.checkpoint import load_for_inference
    from tfmjax.config import ConfigError

    _, params, step = load_for_inference(directory)
    params = params if "params" in params else {"params": params}
    shapes = lambda tree: {
        jax.tree_util.keystr(path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    want, got = shapes(state.params), shapes(params)
    for key in sorted(set(want) | set(got)):
        if want.get(key) != got.get(key):
            raise ConfigError(
                f"train.init_from={directory!r}: its params do not fit this model.* config: "
                f"{key} is {got.get(key)} there and {want.get(key)} here"
            )
    params = jax.tree.map(lambda a, b: jnp.asarray(b, a.dtype), state.params, params)
    return state.replace(params=params, opt_state=tx.init(params)), step
