"""Encoder-decoder transformer (Vaswani et al.; seed 000 §1.4, §3, §4.5).

``model.apply(params, {"inputs": [B,S], "targets": [B,T]})`` returns logits ``[B,T,V]``;
``logits[:, t]`` predicts ``targets[:, t]`` from the inputs and ``BOS, targets[:, :t]``
(teacher forcing, seed 002). ``encode`` and ``decode`` are separate methods for generation:
``model.apply(params, inputs, method="encode")``.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tfmjax.config import ModelConfig
from tfmjax.layers.blocks import BlockInputs, DecoderBlock, EncoderBlock
from tfmjax.layers.stack import layer_cache
from tfmjax.layers.norms import make_norm
from tfmjax.models.checks import check_length
from tfmjax.models.common import (Embedder, OutputHead, PositionExtras, make_stack,
                                  padding_segments, segment_positions, shift_right)


class EncoderDecoder(nn.Module):
    config: ModelConfig
    deterministic: bool = True

    def setup(self):
        cfg = self.config
        self.embedder = Embedder(cfg, name="embed")   # shared by encoder, decoder (and output)
        self.encoder_extras = PositionExtras(cfg, bidirectional=True, name="encoder_extras")
        self.decoder_extras = PositionExtras(cfg, bidirectional=False, name="decoder_extras")
        self.encoder = make_stack(cfg, EncoderBlock, cfg.num_layers, self.deterministic,
                                  name="encoder")
        self.decoder = make_stack(cfg, DecoderBlock, cfg.decoder_layers, self.deterministic,
                                  name="decoder")
        if cfg.norm_position == "pre":
            self.encoder_norm = make_norm(cfg.norm, cfg.norm_eps, name="encoder_norm")
        self.head = OutputHead(cfg, name="head")

    def __call__(self, batch):
        inputs, targets = batch["inputs"], batch["targets"]
        check_length(inputs.shape[1], self.config, "inputs")
        check_length(targets.shape[1], self.config, "targets")
        encoded = self.encode(inputs)
        segment_ids = padding_segments(targets)
        decoder_in = shift_right(targets, segment_ids, self.config.bos_id)
        logits, _ = self.decode(decoder_in, segment_positions(segment_ids), segment_ids,
                                encoded, padding_segments(inputs))
        return logits

    def encode(self, inputs):
        """``inputs [B,S]`` (0 = padding) -> encoder output ``[B,S,D]``."""
        segment_ids = padding_segments(inputs)
        positions = segment_positions(segment_ids)
        slopes, bias = self.encoder_extras(inputs.shape[1], inputs.shape[1])
        x = self.embedder(inputs, positions, deterministic=self.deterministic)
        x, _ = self.encoder(x, None, BlockInputs(positions, segment_ids, slopes, bias))
        return self.encoder_norm(x) if self.config.norm_position == "pre" else x

    def decode(self, input_ids, positions, segment_ids, encoded, encoded_segment_ids, cache=None):
        """Decoder over shifted ``input_ids [B,T]`` attending to ``encoded [B,S,D]``.

        Returns ``(logits [B,T,V], cache)``; the cache is per layer
        ``{"self": KV cache, "cross": {"k", "v"}}`` stacked over layers, or a tuple of
        per-layer caches (see DecoderBlock).
        """
        T = input_ids.shape[1]
        first = None if cache is None else layer_cache(cache, 0)["self"]
        offset = 0 if cache is None else first["index"]
        kv_len = T if cache is None else first["k"].shape[2]
        slopes, bias = self.decoder_extras(T, kv_len, offset)
        x = self.embedder(input_ids, positions, deterministic=self.deterministic)
        inputs = BlockInputs(positions, segment_ids, slopes, bias, encoded,
                             jnp.asarray(encoded_segment_ids, jnp.int32))
        x, cache = self.decoder(x, cache, inputs)
        return self.head(x, self.embedder), cache
