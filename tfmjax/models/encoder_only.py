"""Encoder-only transformer with a masked-LM head (BERT family; Devlin et al. 2019).

``model.apply(params, {"tokens": [B,T]})`` returns logits ``[B,T,V]`` at every position
(bidirectional, no shift). Optional ``segment_ids [B,T]``, ``positions [B,T]`` and, with
``model.type_vocab_size``, ``token_types [B,T]`` (BERT's segment A/B ids; default 0).

Trains on ``masked_lm`` batches (``tokens`` with some positions corrupted, the original
``targets`` and a ``loss_mask`` on the corrupted positions; :mod:`tfmjax.data.text`): the
loss is the masked-token cross-entropy. It does not generate.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from tfmjax.config import ModelConfig
from tfmjax.layers.blocks import BlockInputs, EncoderBlock
from tfmjax.models.checks import InputError, check_concrete_tokens, check_length, check_tokens
from tfmjax.models.common import (
    Embedder,
    OutputHead,
    PositionExtras,
    make_stack,
    padding_segments,
    seen_positions,
    token_positions,
)
from tfmjax.models.family import Family


class EncoderOnly(Family, nn.Module):
    """A masked LM: trains on ``masked_lm`` batches; no generation (those methods raise)."""

    config: ModelConfig
    deterministic: bool = True
    dropout_rate: Any = None  # in place of config.dropout_rate: a traced per-run rate
    head_stage: str = "all"  # OutputHead's stage: "inputs" for a chunked loss

    family = "encoder_only"
    head_stack = "encoder"
    batch_format = "masked_lm"
    token_keys = ("tokens",)

    def setup(self):
        cfg = self.config
        self.embedder = Embedder(cfg, self.dropout_rate, name="embed")
        self.extras = PositionExtras(
            cfg, bidirectional=True, deterministic=self.deterministic, name="extras"
        )
        self.stack = make_stack(
            cfg,
            EncoderBlock,
            cfg.num_layers,
            self.deterministic,
            dropout_rate=self.dropout_rate,
            name="encoder",
            encoder=True,
        )
        self.head = OutputHead(cfg, head_stack=self.head_stack, name="head")

    def __call__(self, batch):
        tokens = batch["tokens"]
        check_length(tokens.shape[1], self.config)
        check_concrete_tokens(tokens, self.config.vocab_size, "tokens")
        segment_ids = batch.get("segment_ids", padding_segments(tokens, self.config.pad_id))
        if "positions" in batch:
            positions = batch["positions"]
        else:
            positions = token_positions(self, segment_ids, self.config, self.deterministic)
        slopes, bias = self.extras(tokens.shape[1], tokens.shape[1], 0, positions)
        positions = seen_positions(self.config, positions, self.deterministic, tokens.shape[1])
        x = self.embedder(
            tokens,
            positions,
            deterministic=self.deterministic,
            token_types=batch.get("token_types"),
        )
        x, _ = self.stack(x, None, BlockInputs(positions, segment_ids, slopes, bias))
        return self.head(x, self.embedder, stage=self.head_stage)

    @nn.nowrap
    def layer_stacks(self) -> dict[str, int]:
        return {"encoder": self.config.num_layers}

    @nn.nowrap
    def check_batch(self, batch: dict, trailing_padding: bool = False) -> None:
        """``tokens`` as every family checks them, and ``targets`` of the same shape."""
        super().check_batch(batch, trailing_padding)
        if "targets" in batch:
            targets = batch["targets"]
            if targets.shape != batch["tokens"].shape:
                raise InputError(
                    f"targets must have the shape of tokens {batch['tokens'].shape}, "
                    f"got {targets.shape}"
                )
            check_tokens(targets, self.config.vocab_size, "targets")

    @nn.nowrap
    def targets_and_mask(self, batch: dict):
        """The original tokens, weighted 1.0 at the corrupted positions only."""
        return batch["targets"], jnp.asarray(batch["loss_mask"], jnp.float32)
