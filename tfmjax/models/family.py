"""The model-family interface: everything the rest of tfmjax asks of a model family.

A family (encoder-decoder, decoder-only, encoder-only, and any added later) is a Linen
module that also subclasses :class:`Family`. Code outside ``tfmjax/models/`` holds a model
built by :func:`tfmjax.models.build` and calls the methods below; it never compares family
names, and reads the config only as ``model.config``. Adding a family means writing one
module here (and, if it trains on a new batch layout, that layout in ``tfmjax/data/``).

Class attributes
  ``family``          the ``model.family`` string
  ``batch_format``    the :mod:`tfmjax.data.batching` layout it trains on, or None
  ``token_keys``      batch keys holding token ids (checked on the host)
  ``segment_keys``    the optional batch key of each token key's segment ids
  ``can_generate``    whether the generation methods exist
  ``equal_length_prompts``  prompts must not be padded: generation groups them by length
  ``prompt_name``     what its generation prompts are called in error messages
  ``head_stack``      the layer stack the output head reads (its hooks: ``{stack}.ln_final``)

Parameters
  ``init(rngs, batch)``                ``nn.Module.init`` returning plain arrays
  ``param_axes(batch)``                the logical axis names of every param (for sharding)

Training (the batch dict of ``batch_format``)
  ``dummy_batch(batch, length)``       all-ones int32 batch for ``init`` / ``eval_shape``
  ``apply_with_aux(params, batch)``    ``(logits, penalty, metrics)``: the auxiliary losses of
                                       mixture-of-experts layers (``aux_metric_names``)
  ``head_inputs_with_aux(params, batch)``  the same stopped before the output projection;
  ``project_head_inputs(params, h)``   the projection: ``[B,C,D]`` -> logits ``[B,C,V]``
  ``check_batch(batch)``               host: one-line :class:`InputError` on bad keys/ids/lengths
  ``positions_in(batch)``              host: sequence positions the batch is computed on
  ``targets_and_mask(batch)``          traced: ids the logits predict and the loss weight ``[B,T]``

Evaluation on a task (host, NumPy)
  ``eval_prompts(batch)``              the prompts generation continues (``[B,P]`` or id lists)
  ``check_task_padding(pad_id)``       host: refuse task batches padded with ``pad_id`` that this
                                       model would read as tokens
  ``eval_answers(batch, M)``           ``([B,M] reference ids, [B,M] positions that must match)``
  ``source_and_target(batch, i)``      row ``i`` as ``(source ids, target ids)``
  ``prompt_for_source(ids)``           the prompt this family was trained to continue
  ``token_mask(ids)``                  host: True where ``ids`` are tokens (not ``model.pad_id``)
  ``position_labels()``                names of the sequence's slots when they are not tokens
                                       (an image model's ``cls``, ``patch 0 (r0,c0)``, ...), else
                                       None: label each position with its token

Generation with a KV cache (``M`` new tokens; :mod:`tfmjax.decode` drives these)
  ``check_generation(lengths, M)``     host: prompts of these lengths fit the positions
  ``prompt_arrays(prompts, lengths, bucket_for=None)``  host: right-padded ``[B,P]`` of
                                       ``lengths [B]`` (None: up to ``model.pad_id``) -> the
                                       arrays ``prefill`` takes; ``bucket_for=M``: padded to a
                                       width bucket (compiles once per bucket), where the
                                       family can take the extra padding unchanged
  ``crop_prompts(prompts, lengths, M)``  host: prompts too long for ``M`` new tokens cut to
                                       the tokens that fit, and how many were dropped (a
                                       family that cannot crop returns them as they are)
  ``init_cache(batch, capacity)``      an empty :class:`~tfmjax.models.cache.KVCache`
  ``kv_cache_bytes(batch, capacity)``  bytes of its keys and values
  ``layer_stacks()``                   ``{params collection: layers}`` of the layer stacks
  ``unrolled(params)``                 ``(model, params)`` with the layers unrolled (decoding)
  ``prefill(params, arrays, M)``       ``(logits [B,V] of the first new token, cache)``
  ``decode_step(params, cache, ids)``  feed ``ids [B]``: ``(next logits [B,V], cache)``
  ``split_prompts(prompts, lengths)``  ``(decoder prefix [B,P'], its lengths [B], context or
                                       None)`` (uncached twin)
  ``sequence_logits(params, tokens, segment_ids, context)``  uncached ``[B,T,V]`` for that twin

Subclasses define these with ``@nn.nowrap``: they are plain Python around ``apply``, not
parts of the Linen computation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta

from tfmjax.config import ModelConfig
from tfmjax.layers.moe import COLLECTION as MOE_COLLECTION
from tfmjax.layers.positions import digit_runs
from tfmjax.layers.stack import unstack_params
from tfmjax.models.checks import (
    InputError,
    check_length,
    check_tokens,
    check_trailing_padding,
)
from tfmjax.models.common import cache_bytes, layer_period


class Family:
    """Mixin of every model family; see the module docstring for the contract."""

    family: ClassVar[str]
    batch_format: ClassVar[str | None] = None
    token_keys: ClassVar[tuple[str, ...]] = ("tokens",)
    segment_keys: ClassVar[dict[str, str]] = {"tokens": "segment_ids"}
    can_generate: ClassVar[bool] = False
    equal_length_prompts: ClassVar[bool] = False  # decode each prompt length apart
    prompt_name: ClassVar[str] = "prompts"
    head_stack: ClassVar[str] = "decoder"
    config: ModelConfig

    # -- parameters --------------------------------------------------------------------

    def init(self, rngs, *args, **kwargs):
        """``nn.Module.init`` with plain arrays as params: the logical axis names the layers
        attach for sharding (:mod:`tfmjax.layers.axes`) are dropped; :meth:`param_axes`
        reads them. Jitted (keyword arguments static): one compile costs a fraction of
        running the initialisers op by op (a 2-layer model: ~3 s against ~10 s on CPU), and
        gives the same bits. The model itself is a static argument of one module-level jit,
        so another ``init`` of an equal model (same class and config) reuses the compile."""
        return _jitted_init(self, tuple(sorted(kwargs.items())), rngs, *args)

    def param_axes(self, batch: dict | None = None):
        """A pytree like the params whose leaves are PartitionSpecs of logical axis
        names (``P("layers", "embed", "heads", "head_width")``); ``P()`` for a param with no
        names. Abstract: no memory, no compute. ``batch`` defaults to :meth:`dummy_batch`."""
        batch = self.dummy_batch() if batch is None else batch
        boxed = jax.eval_shape(lambda: _model_variables(self, jax.random.key(0), batch))
        return nn.get_partition_spec(boxed)

    # -- training ----------------------------------------------------------------------

    def dummy_batch(self, batch: int = 2, length: int = 8) -> dict:
        """An all-ones int32 batch of this family's keys, ``[batch, length]`` each."""
        ones = jnp.ones((batch, length), jnp.int32)
        return {key: ones for key in self.token_keys}

    def check_batch(self, batch: dict, trailing_padding: bool = False) -> None:
        """Check every token array of a batch on the host: keys, rank, ids, lengths; with
        ``model.attention_impl="cudnn"``, also that padding only trails each row, and with
        ``"auto"`` when ``trailing_padding`` (a step traced inside
        :func:`tfmjax.kernels.trailing_padding` will take the batch)."""
        impl = self.config.attention_impl
        trailing = impl == "cudnn" or (trailing_padding and impl == "auto")
        for key in self.token_keys:
            if key not in batch:
                raise InputError(
                    f"a {self.family} batch needs key {key!r}; got keys {sorted(batch)}"
                )
            ids = np.asarray(batch[key])
            if ids.ndim != 2:
                raise InputError(f"{key} must be [batch, length], got shape {ids.shape}")
            check_tokens(ids, self.config.vocab_size, key)
            check_length(ids.shape[1], self.config, key)
            if trailing:
                seg = self.segment_keys.get(key)
                seg_ids = batch[seg] if seg in batch else self.token_mask(ids)
                check_trailing_padding(seg_ids, seg if seg in batch else f"{key} padding", impl)

    def positions_in(self, batch: dict) -> int:
        """Padded sequence positions a batch computes on (throughput's tokens): every
        token array's size."""
        return sum(int(np.size(batch[key])) for key in self.token_keys)

    def targets_and_mask(self, batch: dict):
        raise self._cannot("be trained on a task batch")

    @property
    def aux_metric_names(self) -> tuple[str, ...]:
        """The auxiliary metrics :meth:`apply_with_aux` reports (none for a dense model)."""
        return MOE_METRICS if self.config.moe_experts else ()

    def apply_with_aux(self, params, batch: dict, **kwargs):
        """``(logits, penalty, metrics)``: ``apply`` plus the auxiliary losses of the layers.

        ``penalty`` is the float32 scalar to add to the mean loss per token (the mixtures'
        ``moe_aux_loss_weight * aux + moe_z_loss_weight * z``), ``metrics`` maps each of
        :attr:`aux_metric_names` to its mean over the MoE layers. A dense model runs plain
        ``apply`` (penalty 0, no metrics)."""
        if not self.aux_metric_names:
            return self.apply(params, batch, **kwargs), jnp.zeros((), jnp.float32), {}
        logits, sown = self.apply(params, batch, mutable=[MOE_COLLECTION], **kwargs)
        return (logits, *moe_terms(sown.get(MOE_COLLECTION, {}), self.config))

    def head_inputs_with_aux(self, params, batch: dict, **kwargs):
        """``(head inputs [B,T,D], penalty, metrics)``: :meth:`apply_with_aux` stopped before
        the output projection (the final norm and any masked-LM transform applied); with
        :meth:`project_head_inputs` the loss forms the logits a few positions at a time."""
        return self.clone(head_stage="inputs").apply_with_aux(params, batch, **kwargs)

    def project_head_inputs(self, params, head_inputs):
        """``head inputs [B,C,D]`` -> float32 logits ``[B,C,V]``: the rest of the head."""

        def project(module, x):
            return module.head(x, module.embedder, stage="project")

        return self.apply(params, head_inputs, method=project)

    # -- evaluation and generation -------------------------------------------------------

    def eval_prompts(self, batch: dict) -> np.ndarray:
        raise self._cannot("generate")

    def eval_answers(self, batch: dict, max_new_tokens: int):
        raise self._cannot("generate")

    def crop_prompts(self, prompts: np.ndarray, lengths: np.ndarray, max_new_tokens: int):
        """``(prompts, lengths, dropped [B])``: the default keeps every prompt whole (nothing
        dropped), and :meth:`check_generation` refuses those that do not fit."""
        del max_new_tokens
        return prompts, lengths, np.zeros_like(lengths)

    def check_task_padding(self, pad_id: int) -> None:
        """Task batches (:mod:`tfmjax.data.batching`) pad with ``pad_id``: a ValueError (one
        line) if this model would read that padding as tokens that change its results. The
        default: padding only trails each row, where a causal model never looks back at it and
        the loss mask leaves it out."""

    def source_and_target(self, batch: dict, i: int):
        raise self._cannot("be evaluated on a task")

    def prompt_for_source(self, source_ids: list[int]) -> list[int]:
        raise self._cannot("generate")

    def token_mask(self, ids) -> np.ndarray:
        """True where ``ids`` are tokens, False on padding (``model.pad_id``; a model without
        a pad id has no padding id, every id is a token). NumPy, same shape as ``ids``."""
        ids, pad = np.asarray(ids), self.config.pad_id
        return np.ones(ids.shape, bool) if pad is None else ids != pad

    def position_labels(self) -> list[str] | None:
        """The name of each slot of the sequence when slots are not tokens; None: a position
        is labelled by the token it holds (the default)."""
        return None

    def layer_stacks(self) -> dict[str, int]:
        """``{params collection name: number of layers}`` of the model's layer stacks."""
        raise NotImplementedError

    def kv_cache_bytes(self, batch: int, capacity: int) -> int:
        """Bytes of the decoder self-attention cache by formula (:func:`cache_bytes`:
        ``2 · B · L · K · S · H · bytes`` for softmax attention)."""
        return cache_bytes(self.config, batch, self.layer_stacks()["decoder"], capacity)

    def unrolled(self, params):
        """``(model, params)`` with ``scan_layers=False``: the same function, layers unrolled.

        Scanned stacks ``{"layers": [L, ...]}`` become ``{"layer_0": ..., ...}``; a model that
        is already unrolled is returned as it is. Dropout is off in the result.
        """
        if not self.config.scan_layers:
            return self, params
        stacks, period = self.layer_stacks(), layer_period(self.config)
        inner = {
            name: unstack_params(sub, stacks[name], period)
            if name in stacks and "layers" in sub
            else sub
            for name, sub in params["params"].items()
        }
        model = type(self)(dataclasses.replace(self.config, scan_layers=False), deterministic=True)
        return model, dict(params, params=inner)

    def digit_runs(self, ids, carry=None):
        """The abacus place of each row's last token ``[B]`` after feeding ``ids [B,T]`` (the
        carry of the next decoding step), or None when ``model.position`` is not abacus."""
        if self.config.position != "abacus":
            return None
        return digit_runs(ids, self.config.digit_first_id, carry)[:, -1]

    def _cannot(self, what: str) -> Exception:
        return NotImplementedError(
            f"a {self.family} model cannot {what}; use a decoder_only or encoder_decoder model"
        )


MOE_METRICS = ("moe_aux_loss", "moe_z_loss", "moe_dropped_fraction")


def moe_terms(sown: dict, cfg: ModelConfig):
    """``(penalty, metrics)`` of the scalars the MoE layers sowed (``aux_loss``, ``z_loss``,
    ``dropped``; stacked over scanned layers): each averaged over the layers, the penalty
    weighted by ``model.moe_aux_loss_weight`` and ``model.moe_z_loss_weight``."""
    found = {"aux_loss": [], "z_loss": [], "dropped": []}
    for path, leaf in jax.tree_util.tree_flatten_with_path(sown)[0]:
        name = next(p.key for p in reversed(path) if isinstance(p, jax.tree_util.DictKey))
        found[name].append(jnp.ravel(leaf))
    mean = {name: jnp.mean(jnp.concatenate(v)) for name, v in found.items()}
    penalty = cfg.moe_aux_loss_weight * mean["aux_loss"] + cfg.moe_z_loss_weight * mean["z_loss"]
    metrics = dict(
        zip(MOE_METRICS, (mean["aux_loss"], mean["z_loss"], mean["dropped"]), strict=True)
    )
    return penalty.astype(jnp.float32), metrics


@functools.partial(jax.jit, static_argnums=(0, 1))
def _jitted_init(model, kwargs: tuple, rngs, *args) -> dict:
    """:meth:`Family.init`'s program: ``kwargs`` as sorted ``(name, value)`` pairs."""
    return meta.unbox(_model_variables(model, rngs, *args, **dict(kwargs)))


def _model_variables(model, rngs, *args, **kwargs) -> dict:
    """``nn.Module.init`` without the values the layers sow while it runs (the MoE losses
    of :data:`MOE_COLLECTION`): what remains is the model's variables."""
    variables = nn.Module.init(model, rngs, *args, **kwargs)
    return {name: tree for name, tree in variables.items() if name != MOE_COLLECTION}
