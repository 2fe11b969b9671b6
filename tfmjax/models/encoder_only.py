"""Encoder-only transformer with a masked-LM head (BERT family; Devlin et al. 2019).

``model.apply(params, {"tokens": [B,T]})`` returns logits ``[B,T,V]`` at every position
(bidirectional, no shift). Optional ``segment_ids [B,T]``, ``positions [B,T]`` and, with
``model.type_vocab_size``, ``token_types [B,T]`` (BERT's segment A/B ids; default 0).
"""

from __future__ import annotations

import flax.linen as nn

from tfmjax.config import ModelConfig
from tfmjax.layers.blocks import BlockInputs, EncoderBlock
from tfmjax.models.checks import check_concrete_tokens, check_length
from tfmjax.models.common import (
    Embedder,
    OutputHead,
    PositionExtras,
    make_stack,
    padding_segments,
    segment_positions,
)
from tfmjax.models.family import Family


class EncoderOnly(Family, nn.Module):
    """No task batch format yet and no generation: the family methods raise for those."""

    config: ModelConfig
    deterministic: bool = True

    family = "encoder_only"
    token_keys = ("tokens",)

    def setup(self):
        cfg = self.config
        self.embedder = Embedder(cfg, name="embed")
        self.extras = PositionExtras(cfg, bidirectional=True, name="extras")
        self.stack = make_stack(
            cfg, EncoderBlock, cfg.num_layers, self.deterministic, name="encoder"
        )
        self.head = OutputHead(cfg, name="head")

    def __call__(self, batch):
        tokens = batch["tokens"]
        check_length(tokens.shape[1], self.config)
        check_concrete_tokens(tokens, self.config.vocab_size, "tokens")
        segment_ids = batch.get("segment_ids", padding_segments(tokens))
        positions = batch.get("positions", segment_positions(segment_ids))
        slopes, bias = self.extras(tokens.shape[1], tokens.shape[1])
        x = self.embedder(
            tokens,
            positions,
            deterministic=self.deterministic,
            token_types=batch.get("token_types"),
        )
        x, _ = self.stack(x, None, BlockInputs(positions, segment_ids, slopes, bias))
        return self.head(x, self.embedder)

    @nn.nowrap
    def layer_stacks(self) -> dict[str, int]:
        return {"encoder": self.config.num_layers}
