"""Encoder-decoder transformer (Vaswani et al. 2017).

``model.apply(params, {"inputs": [B,S], "targets": [B,T]})`` returns logits ``[B,T,V]``;
``logits[:, t]`` predicts ``targets[:, t]`` from the inputs and ``BOS, targets[:, :t]``
(teacher forcing). Optional batch keys ``input_segment_ids [B,S]`` and
``target_segment_ids [B,T]`` (0 = padding); without them, a token equal to ``model.pad_id`` is
padding. ``encode`` and ``decode`` are separate methods for generation:
``model.apply(params, inputs, method="encode")``.

Trains on ``seq2seq`` batches (``inputs``, ``targets``; see :mod:`tfmjax.data.batching`);
the family methods are described in :mod:`tfmjax.models.family`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tfmjax.config import ModelConfig
from tfmjax.data.vocab import EOS_ID
from tfmjax.layers.blocks import BlockInputs, DecoderBlock, EncoderBlock
from tfmjax.layers.hooks import hook
from tfmjax.layers.norms import make_norm
from tfmjax.layers.stack import layer_cache
from tfmjax.models.cache import KVCache
from tfmjax.models.checks import check_concrete_tokens, check_length
from tfmjax.models.common import (
    Embedder,
    OutputHead,
    PositionExtras,
    draw_abacus_places,
    encoder_block_config,
    init_self_attention_cache,
    make_stack,
    padding_segments,
    positions_from_segments,
    seen_positions,
    shift_right,
    token_positions,
)
from tfmjax.models.family import Family
from tfmjax.models.prompts import FILL, bucket, prompt_lengths, segments_from_lengths


class EncoderDecoder(Family, nn.Module):
    config: ModelConfig
    deterministic: bool = True
    dropout_rate: Any = None  # in place of config.dropout_rate: a traced per-run rate
    head_stage: str = "all"  # OutputHead's stage: "inputs" for a chunked loss

    family = "encoder_decoder"
    batch_format = "seq2seq"
    token_keys = ("inputs", "targets")
    segment_keys = {"inputs": "input_segment_ids", "targets": "target_segment_ids"}
    can_generate = True
    prompt_name = "encoder inputs"

    def setup(self):
        cfg = self.config
        # shared by encoder, decoder (and output)
        self.embedder = Embedder(cfg, self.dropout_rate, name="embed")
        self.encoder_extras = PositionExtras(
            cfg, bidirectional=True, deterministic=self.deterministic, name="encoder_extras"
        )
        self.decoder_extras = PositionExtras(
            cfg, bidirectional=False, deterministic=self.deterministic, name="decoder_extras"
        )
        self.encoder = make_stack(
            cfg,
            EncoderBlock,
            cfg.num_layers,
            self.deterministic,
            dropout_rate=self.dropout_rate,
            name="encoder",
            encoder=True,
        )
        self.decoder = make_stack(
            cfg,
            DecoderBlock,
            cfg.decoder_layers,
            self.deterministic,
            dropout_rate=self.dropout_rate,
            name="decoder",
        )
        if cfg.norm_position == "pre":
            self.encoder_norm = make_norm(cfg.norm, cfg.norm_eps, name="encoder_norm")
        self.head = OutputHead(cfg, name="head")

    def __call__(self, batch):
        inputs, targets = batch["inputs"], batch["targets"]
        for name, ids in (("inputs", inputs), ("targets", targets)):
            check_length(ids.shape[1], self.config, name)
            check_concrete_tokens(ids, self.config.vocab_size, name)
        input_segment_ids, segment_ids = self.segment_ids(batch)
        decoder_in = shift_right(targets, segment_ids, self.config.bos_id)
        # One Abacus place map per row for both sides: operand and answer places stay aligned.
        places = draw_abacus_places(self, self.config, self.deterministic, inputs, decoder_in)
        encoded = self.encode(inputs, input_segment_ids, abacus_map=places)
        logits, _ = self.decode(
            decoder_in,
            token_positions(self, segment_ids, self.config, self.deterministic),
            segment_ids,
            encoded,
            input_segment_ids,
            abacus_map=places,
        )
        return logits

    @nn.nowrap
    def segment_ids(self, batch: dict):
        """``(input_segment_ids [B,S], target_segment_ids [B,T])``: the batch's, else 0 where
        a token is ``model.pad_id``."""
        pad = self.config.pad_id
        return tuple(
            batch.get(f"{side}_segment_ids", padding_segments(batch[key], pad))
            for side, key in (("input", "inputs"), ("target", "targets"))
        )

    def encode(self, inputs, segment_ids=None, abacus_map=None):
        """``inputs [B,S]`` -> encoder output ``[B,S,D]``; ``segment_ids [B,S]`` (0 =
        padding) default to 0 where an input is ``model.pad_id``; ``abacus_map [B,R]``:
        the training places of Abacus (:func:`draw_abacus_places`)."""
        if segment_ids is None:
            segment_ids = padding_segments(inputs, self.config.pad_id)
        positions = token_positions(self, segment_ids, self.config, self.deterministic)
        slopes, bias = self.encoder_extras(inputs.shape[1], inputs.shape[1], 0, positions)
        positions = seen_positions(self.config, positions, self.deterministic, inputs.shape[1])
        x = self.embedder(
            inputs, positions, deterministic=self.deterministic, abacus_map=abacus_map
        )
        x, _ = self.encoder(x, None, BlockInputs(positions, segment_ids, slopes, bias))
        x = self.encoder_norm(x) if self.config.norm_position == "pre" else x
        return hook(self, "encoder.hook_out", x)

    def decode(
        self,
        input_ids,
        positions,
        segment_ids,
        encoded,
        encoded_segment_ids,
        cache=None,
        carry=None,
        abacus_map=None,
    ):
        """Decoder over shifted ``input_ids [B,T]`` attending to ``encoded [B,S,D]``;
        ``carry [B]``: the abacus place of the token before ``input_ids`` (decoding);
        ``abacus_map [B,R]``: the training places of Abacus, shared with the encoder.

        Returns ``(logits [B,T,V], cache)``; the cache is per layer
        ``{"self": KV cache, "cross": {"k", "v"}}`` stacked over layers, or a tuple of
        per-layer caches (see DecoderBlock).
        """
        T = input_ids.shape[1]
        first = None if cache is None else layer_cache(cache, 0)["self"]
        offset = 0 if cache is None else first["index"]
        kv_len = T if cache is None or "k" not in first else first["k"].shape[2]
        slopes, bias = self.decoder_extras(T, kv_len, offset, positions, cached=cache is not None)
        positions = seen_positions(self.config, positions, self.deterministic, kv_len)
        x = self.embedder(
            input_ids,
            positions,
            deterministic=self.deterministic,
            side="decoder",
            carry=carry,
            abacus_map=abacus_map,
        )
        inputs = BlockInputs(
            positions,
            segment_ids,
            slopes,
            bias,
            encoded,
            jnp.asarray(encoded_segment_ids, jnp.int32),
        )
        x, cache = self.decoder(x, cache, inputs)
        return self.head(x, self.embedder, stage=self.head_stage), cache

    # -- the family interface (see tfmjax.models.family) ------------------------------------

    @nn.nowrap
    def layer_stacks(self) -> dict[str, int]:
        return {"encoder": self.config.num_layers, "decoder": self.config.decoder_layers}

    @nn.nowrap
    def targets_and_mask(self, batch: dict):
        """The targets themselves; loss on every non-padding target token (EOS included)."""
        return batch["targets"], (self.segment_ids(batch)[1] > 0).astype(jnp.float32)

    @nn.nowrap
    def check_task_padding(self, pad_id: int) -> None:
        """Encoder inputs and targets are padded: the model must read ``pad_id`` as padding."""
        if self.config.pad_id != pad_id:
            raise ValueError(
                f"task batches pad with {pad_id} but model.pad_id={self.config.pad_id}: the "
                f"encoder would attend to the padding; set model.pad_id={pad_id} to train or "
                "evaluate on a toy task"
            )

    @nn.nowrap
    def eval_prompts(self, batch: dict) -> np.ndarray:
        """The encoder inputs (``source EOS``)."""
        return np.asarray(batch["inputs"])

    @nn.nowrap
    def eval_answers(self, batch: dict, max_new_tokens: int):
        """The targets (answer, EOS, then padding), cut or padded to ``M``, and their
        non-padding mask (:meth:`segment_ids`)."""
        B, width = batch["targets"].shape[0], min(max_new_tokens, batch["targets"].shape[1])
        targets, real = np.zeros((B, max_new_tokens), np.int32), np.zeros((B, max_new_tokens))
        targets[:, :width] = batch["targets"][:, :width]
        real[:, :width] = np.asarray(self.segment_ids(batch)[1])[:, :width]
        return targets, real > 0

    @nn.nowrap
    def source_and_target(self, batch: dict, i: int):
        return batch["inputs"][i], batch["targets"][i]

    @nn.nowrap
    def prompt_for_source(self, source_ids: list[int]) -> list[int]:
        return list(source_ids) + [EOS_ID]

    @nn.nowrap
    def check_generation(self, lengths, max_new_tokens: int) -> None:
        """Inputs and outputs must each fit in ``model.max_len`` positions."""
        longest, limit = int(np.max(lengths)), self.config.max_len
        if longest > limit:  # the encoder reads its whole input: nothing can slide
            raise ValueError(
                f"encoder input length {longest} exceeds model.max_len={limit}: give an input "
                f"of at most {limit} tokens (its EOS included)"
            )
        if max_new_tokens > limit:
            raise ValueError(
                f"max_new_tokens {max_new_tokens} exceeds model.max_len={limit}: ask for "
                f"max_new_tokens <= {limit}"
            )

    @nn.nowrap
    def prompt_arrays(self, prompts: np.ndarray, lengths=None, bucket_for: int | None = None):
        """The right-padded encoder inputs and their segment ids from ``lengths`` (default:
        before ``model.pad_id``): ``(inputs [B,S], segment_ids [B,S])``. ``bucket_for``
        (``M``): ``S`` padded further on the right to the next power of two, at most
        ``model.max_len`` (padding has segment id 0: no token attends to it); unchanged
        for a Nystrom encoder, whose landmarks are means over the input's width (a Linformer
        encoder is bucketed: right padding is zeroed before its projection)."""
        lengths = prompt_lengths(prompts, self.config.pad_id) if lengths is None else lengths
        width = prompts.shape[1]
        if bucket_for is not None and encoder_block_config(self.config).attention != "nystrom":
            width = bucket(width, self.config.max_len)
        fill = FILL if self.config.pad_id is None else self.config.pad_id
        inputs = np.pad(prompts, ((0, 0), (0, width - prompts.shape[1])), constant_values=fill)
        return inputs, segments_from_lengths(lengths, width)

    @nn.nowrap
    def init_cache(self, batch: int, capacity: int) -> KVCache:
        cfg = self.config
        layers = tuple(
            {"self": init_self_attention_cache(cfg, batch, capacity)}
            for _ in range(cfg.decoder_layers)
        )
        return KVCache(layers=layers, lengths=jnp.zeros((batch,), jnp.int32))

    @nn.nowrap
    def prefill(self, params, arrays: tuple, max_new_tokens: int):
        """Encode once, project the cross K/V once (first decoder call) and run BOS.
        ``arrays``: :meth:`prompt_arrays`' ``(inputs, segment_ids)``, or ``(inputs,)``."""
        model, params = self.unrolled(params)
        inputs, *given = arrays  # (inputs,): segment ids from model.pad_id
        encoded_segment_ids = given[0] if given else padding_segments(inputs, self.config.pad_id)
        B = inputs.shape[0]
        encoded = model.apply(params, inputs, encoded_segment_ids, method="encode")
        cache = model.init_cache(B, max_new_tokens)
        bos = jnp.full((B, 1), self.config.bos_id, jnp.int32)
        logits, layers = model.apply(
            params,
            bos,
            jnp.zeros((B, 1), jnp.int32),
            jnp.ones((B, 1), jnp.int32),
            encoded,
            encoded_segment_ids,
            cache.layers,
            method="decode",
        )
        cache = KVCache(
            layers=layers,
            lengths=jnp.ones((B,), jnp.int32),
            encoded=encoded,
            encoded_segment_ids=encoded_segment_ids,
            digit_run=self.digit_runs(bos),
        )
        return logits[:, -1], cache

    @nn.nowrap
    def decode_step(self, params, cache: KVCache, tokens):
        """Feed ``tokens [B]`` at position ``cache.lengths``: ``(logits [B,V], cache)``."""
        model, params = self.unrolled(params)
        ids = tokens.astype(jnp.int32)[:, None]
        logits, layers = model.apply(
            params,
            ids,
            cache.lengths[:, None],
            jnp.ones_like(ids),
            cache.encoded,
            cache.encoded_segment_ids,
            cache.layers,
            cache.digit_run,
            method="decode",
        )
        runs = self.digit_runs(ids, cache.digit_run)
        new = dataclasses.replace(cache, layers=layers, lengths=cache.lengths + 1, digit_run=runs)
        return logits[:, 0], new

    @nn.nowrap
    def split_prompts(self, prompts: np.ndarray, lengths):
        """The prompts and their segment ids are the encoder's context; the decoder starts
        empty (behind BOS)."""
        B = prompts.shape[0]
        context = (prompts, segments_from_lengths(lengths, prompts.shape[1]))
        return np.zeros((B, 0), np.int32), np.zeros((B,), np.int32), context

    @nn.nowrap
    def sequence_logits(self, params, tokens, segment_ids, context=None):
        """Uncached ``[B,T,V]``: encoder over ``context`` (inputs, or ``(inputs, segment
        ids)``), decoder over ``BOS, tokens[:, :-1]``."""
        bos = self.config.bos_id
        shifted = jnp.concatenate([jnp.full_like(tokens[:, :1], bos), tokens[:, :-1]], axis=1)
        if not isinstance(context, tuple):
            context = (context, padding_segments(context, self.config.pad_id))
        encoded = self.apply(params, *context, method="encode")
        logits, _ = self.apply(
            params,
            shifted,
            positions_from_segments(segment_ids),
            segment_ids,
            encoded,
            context[1],
            method="decode",
        )
        return logits
