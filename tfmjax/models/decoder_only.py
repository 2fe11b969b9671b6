"""Decoder-only transformer (GPT / LLaMA family; Radford et al. 2018, Touvron et al. 2023).

``model.apply(params, {"tokens": [B,T]})`` returns logits ``[B,T,V]`` where ``logits[:, t]``
predicts ``tokens[:, t]`` from ``BOS, tokens[:, :t]`` (the model shifts right itself).
Optional batch keys: ``segment_ids [B,T]`` (packing; 0 = padding; default: 0 where a token is
``model.pad_id``) and ``positions [B,T]``.

Trains on ``prompt_answer`` batches (``tokens``, ``loss_mask``, ``prompt_len``; see
:mod:`tfmjax.data.batching`); the family methods are described in :mod:`tfmjax.models.family`.
Generation left-pads prompts, behind BOS when ``model.prompt_bos`` (the toy tasks) and as
they are otherwise (imported models: :mod:`tfmjax.models.prompts`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tfmjax.config import ModelConfig
from tfmjax.data.batching import split_prompt_answer
from tfmjax.data.vocab import SEP_ID
from tfmjax.layers.blocks import BlockInputs, SelfAttentionBlock
from tfmjax.layers.stack import layer_cache
from tfmjax.models.cache import KVCache
from tfmjax.models.checks import check_concrete_tokens, check_length
from tfmjax.models.common import (
    Embedder,
    OutputHead,
    PositionExtras,
    init_self_attention_cache,
    make_stack,
    padding_segments,
    positions_from_segments,
    seen_positions,
    shift_right,
    token_positions,
)
from tfmjax.models.family import Family
from tfmjax.models.prompts import FILL, bucket, left_pad_decoder_prompts, prompt_lengths


class DecoderOnly(Family, nn.Module):
    config: ModelConfig
    deterministic: bool = True
    dropout_rate: Any = None  # in place of config.dropout_rate: a traced per-run rate
    head_stage: str = "all"  # OutputHead's stage: "inputs" for a chunked loss

    family = "decoder_only"
    batch_format = "prompt_answer"
    token_keys = ("tokens",)
    can_generate = True

    def setup(self):
        cfg = self.config
        self.embedder = Embedder(cfg, self.dropout_rate, name="embed")
        self.extras = PositionExtras(
            cfg, bidirectional=False, deterministic=self.deterministic, name="extras"
        )
        self.stack = make_stack(
            cfg,
            SelfAttentionBlock,
            cfg.num_layers,
            self.deterministic,
            dropout_rate=self.dropout_rate,
            name="decoder",
            causal=True,
        )
        self.head = OutputHead(cfg, name="head")

    def __call__(self, batch):
        tokens = batch["tokens"]
        check_length(tokens.shape[1], self.config)
        check_concrete_tokens(tokens, self.config.vocab_size, "tokens")
        segment_ids = batch.get("segment_ids", padding_segments(tokens, self.config.pad_id))
        if "positions" in batch:
            positions = batch["positions"]
        else:
            positions = token_positions(self, segment_ids, self.config, self.deterministic)
        inputs = shift_right(tokens, segment_ids, self.config.bos_id)
        logits, _ = self.forward(inputs, positions, segment_ids)
        return logits

    def forward(self, input_ids, positions, segment_ids, cache=None, carry=None):
        """Raw forward over already-shifted ``input_ids [B,T]``: returns ``(logits, cache)``.

        With a cache (see :func:`tfmjax.layers.attention.init_cache`, stacked over layers or
        a tuple of per-layer caches)
        the new tokens go to slots ``index .. index+T`` and attend to every filled slot.
        ``carry [B]``: the abacus place of the token before ``input_ids`` (decoding).
        """
        T = input_ids.shape[1]
        first = None if cache is None else layer_cache(cache, 0)
        offset = 0 if cache is None else first["index"]
        kv_len = T if cache is None or "k" not in first else first["k"].shape[2]
        slopes, bias = self.extras(T, kv_len, offset, positions, cached=cache is not None)
        positions = seen_positions(self.config, positions, self.deterministic, kv_len)
        x = self.embedder(
            input_ids, positions, deterministic=self.deterministic, side="decoder", carry=carry
        )
        x, cache = self.stack(x, cache, BlockInputs(positions, segment_ids, slopes, bias))
        return self.head(x, self.embedder, stage=self.head_stage), cache

    # -- the family interface (see tfmjax.models.family) ------------------------------------

    @nn.nowrap
    def layer_stacks(self) -> dict[str, int]:
        return {"decoder": self.config.num_layers}

    @nn.nowrap
    def targets_and_mask(self, batch: dict):
        """Every token is a target; ``loss_mask`` keeps the answer (and its EOS) only."""
        return batch["tokens"], jnp.asarray(batch["loss_mask"], jnp.float32)

    @nn.nowrap
    def eval_prompts(self, batch: dict) -> list[list[int]]:
        """Each row's ``source SEP`` (its first ``prompt_len`` tokens) as an id list, so its
        length is explicit whatever ``model.pad_id`` is; the answer is not read."""
        tokens, prompt_len = np.asarray(batch["tokens"]), np.asarray(batch["prompt_len"])
        return [[int(t) for t in row[:n]] for row, n in zip(tokens, prompt_len, strict=True)]

    @nn.nowrap
    def eval_answers(self, batch: dict, max_new_tokens: int):
        """The tokens after each prompt (answer, EOS, then PAD) and where they must match."""
        tokens, mask, prompt_len = batch["tokens"], batch["loss_mask"], batch["prompt_len"]
        width = tokens.shape[1]
        idx = prompt_len[:, None] + np.arange(max_new_tokens)[None, :]
        inside = idx < width
        idx = np.minimum(idx, width - 1)
        targets = np.where(inside, np.take_along_axis(tokens, idx, axis=1), FILL)
        return targets.astype(np.int32), inside & (np.take_along_axis(mask, idx, axis=1) > 0)

    @nn.nowrap
    def source_and_target(self, batch: dict, i: int):
        return split_prompt_answer(batch["tokens"][i], int(batch["prompt_len"][i]))

    @nn.nowrap
    def prompt_for_source(self, source_ids: list[int]) -> list[int]:
        return list(source_ids) + [SEP_ID]

    @property
    def equal_length_prompts(self) -> bool:
        """Global tokens are the first cache slots and random blocks are counted from slot 0,
        and left padding would shift them, so :func:`tfmjax.decode.generate` decodes prompts of
        each length apart."""
        return self.config.global_tokens > 0 or self.config.random_blocks > 0

    @nn.nowrap
    def check_generation(self, lengths, max_new_tokens: int) -> None:
        """Prompt + new tokens must fit in ``model.max_len`` positions; without BOS
        (``model.prompt_bos = false``) every prompt needs a token to continue."""
        longest, limit = int(np.max(lengths)), self.config.max_len
        if not self.config.prompt_bos and int(np.min(lengths)) < 1:
            raise ValueError(
                "an empty prompt: this model continues exactly the ids it is given "
                "(model.prompt_bos = false), so each prompt needs at least one id"
            )
        if longest + max_new_tokens > limit:
            room = limit - longest
            fewer = f"max_new_tokens <= {room}" if room > 0 else "a shorter prompt"
            raise ValueError(
                f"prompt length {longest} + max_new_tokens {max_new_tokens} = "
                f"{longest + max_new_tokens} exceeds model.max_len={limit}: ask for {fewer} "
                "(a language model's text continues past it through tfmjax.generate_text or "
                "python -m tfmjax.generate --input, whose window slides)"
            )

    @nn.nowrap
    def prompt_arrays(self, prompts: np.ndarray, lengths=None, bucket_for: int | None = None):
        """Right-padded ``[B,P]`` of ``lengths`` (default: before ``model.pad_id``) ->
        left-padded ``(ids, positions, segment_ids)`` ``[B,P']``, behind BOS if
        ``model.prompt_bos``. ``bucket_for=M``: ``P'`` padded further on the left to the next
        power of two, at most ``model.max_len - M + 1`` (the cache then keeps within
        ``max_len`` slots); unchanged under :attr:`equal_length_prompts`. More left padding
        changes no position and no distance between slots (see
        :mod:`tfmjax.models.prompts`)."""
        cfg = self.config
        lengths = prompt_lengths(prompts, cfg.pad_id) if lengths is None else lengths
        bos = cfg.bos_id if cfg.prompt_bos else None
        width = None
        if bucket_for is not None and not self.equal_length_prompts:
            width = bucket(int(np.max(lengths)) + (bos is not None), cfg.max_len - bucket_for + 1)
        return tuple(left_pad_decoder_prompts(prompts, lengths, bos, width)[:3])

    @nn.nowrap
    def crop_prompts(self, prompts: np.ndarray, lengths: np.ndarray, max_new_tokens: int):
        """Rows longer than ``model.max_len - M`` keep their last tokens that fit:
        ``(prompts [B,P''], lengths [B], dropped [B])``, ``dropped`` the tokens cut from the
        front of each row. Nothing is cut when ``M`` alone fills the context
        (:meth:`check_generation` then refuses)."""
        room = self.config.max_len - max_new_tokens
        if int(np.max(lengths)) <= room or room < 1:
            return prompts, lengths, np.zeros_like(lengths)
        cropped = np.full((prompts.shape[0], room), FILL, prompts.dtype)
        if self.config.pad_id is not None:
            cropped[:] = self.config.pad_id
        for i, n in enumerate(lengths):
            keep = min(int(n), room)
            cropped[i, :keep] = prompts[i, n - keep : n]
        return cropped, np.minimum(lengths, room).astype(np.int32), np.maximum(lengths - room, 0)

    @nn.nowrap
    def init_cache(self, batch: int, capacity: int) -> KVCache:
        cfg = self.config
        layers = tuple(
            init_self_attention_cache(cfg, batch, capacity) for _ in range(cfg.num_layers)
        )
        return KVCache(layers=layers, lengths=jnp.zeros((batch,), jnp.int32))

    @nn.nowrap
    def prefill(self, params, arrays: tuple, max_new_tokens: int):
        """The whole left-padded prompt (BOS included) in one pass; room for ``M - 1`` more."""
        model, params = self.unrolled(params)
        ids, positions, segment_ids = arrays
        cache = model.init_cache(ids.shape[0], ids.shape[1] + max_new_tokens - 1)
        logits, layers = model.apply(
            params, ids, positions, segment_ids, cache.layers, method="forward"
        )
        lengths = jnp.max(positions, axis=1).astype(jnp.int32) + 1
        runs = self.digit_runs(ids)
        return logits[:, -1], KVCache(layers=layers, lengths=lengths, digit_run=runs)

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
            cache.layers,
            cache.digit_run,
            method="forward",
        )
        runs = self.digit_runs(ids, cache.digit_run)
        new = dataclasses.replace(cache, layers=layers, lengths=cache.lengths + 1, digit_run=runs)
        return logits[:, 0], new

    @nn.nowrap
    def split_prompts(self, prompts: np.ndarray, lengths):
        """The whole prompt is the decoder's prefix; there is no separate context."""
        return prompts, np.asarray(lengths, np.int32), None

    @nn.nowrap
    def sequence_logits(self, params, tokens, segment_ids, context=None):
        """Uncached ``[B,T,V]`` of right-padded tokens; ``logits[:, j]`` predicts token ``j``
        (from BOS and the tokens before it; without ``model.prompt_bos``, from the tokens
        before it alone: ``logits[:, 0]`` is then zeros, nothing predicts the first token)."""
        positions = positions_from_segments(segment_ids)
        if self.config.prompt_bos:
            batch = {"tokens": tokens, "segment_ids": segment_ids, "positions": positions}
            return self.apply(params, batch)
        logits, _ = self.apply(params, tokens, positions, segment_ids, method="forward")
        return jnp.pad(logits[:, :-1], ((0, 0), (1, 0), (0, 0)))
