"""Decoder-only transformer (GPT / LLaMA family, seed 000 §4.4 and §4.6).

``model.apply(params, {"tokens": [B,T]})`` returns logits ``[B,T,V]`` where ``logits[:, t]``
predicts ``tokens[:, t]`` from ``BOS, tokens[:, :t]`` (the model shifts right itself).
Optional batch keys: ``segment_ids [B,T]`` (packing; 0 = padding) and ``positions [B,T]``.
"""
from __future__ import annotations

import flax.linen as nn

from tfmjax.config import ModelConfig
from tfmjax.layers.blocks import BlockInputs, SelfAttentionBlock
from tfmjax.layers.stack import layer_cache
from tfmjax.models.checks import check_length
from tfmjax.models.common import (Embedder, OutputHead, PositionExtras, make_stack,
                                  padding_segments, segment_positions, shift_right)


class DecoderOnly(nn.Module):
    config: ModelConfig
    deterministic: bool = True

    def setup(self):
        cfg = self.config
        self.embedder = Embedder(cfg, name="embed")
        self.extras = PositionExtras(cfg, bidirectional=False, name="extras")
        self.stack = make_stack(cfg, SelfAttentionBlock, cfg.num_layers, self.deterministic,
                                name="decoder", causal=True)
        self.head = OutputHead(cfg, name="head")

    def __call__(self, batch):
        tokens = batch["tokens"]
        check_length(tokens.shape[1], self.config)
        segment_ids = batch.get("segment_ids", padding_segments(tokens))
        positions = batch.get("positions", segment_positions(segment_ids))
        inputs = shift_right(tokens, segment_ids, self.config.bos_id)
        logits, _ = self.forward(inputs, positions, segment_ids)
        return logits

    def forward(self, input_ids, positions, segment_ids, cache=None):
        """Raw forward over already-shifted ``input_ids [B,T]``: returns ``(logits, cache)``.

        With a cache (see :func:`tfmjax.layers.attention.init_cache`, stacked over layers or
        a tuple of per-layer caches)
        the new tokens go to slots ``index .. index+T`` and attend to every filled slot.
        """
        T = input_ids.shape[1]
        first = None if cache is None else layer_cache(cache, 0)
        offset = 0 if cache is None else first["index"]
        kv_len = T if cache is None else first["k"].shape[2]
        slopes, bias = self.extras(T, kv_len, offset)
        x = self.embedder(input_ids, positions, deterministic=self.deterministic)
        x, cache = self.stack(x, cache, BlockInputs(positions, segment_ids, slopes, bias))
        return self.head(x, self.embedder), cache
