"""The encoder-only family reading images as sequences (ViT, Dosovitskiy et al. 2021).

``model.input = "patches"``: ``model.apply(params, {"images": [B,Hi,Wi,C]})`` cuts each image
into ``model.patch_size`` squares, projects each flattened patch to ``D``, puts a learned
class token first and adds a learned position per slot (:mod:`tfmjax.layers.patches`); the
encoder stack runs as for tokens (bidirectional, no padding), and the head (final norm,
projection) reads every slot: logits ``[B,1+P,V]`` over ``V = model.vocab_size`` classes, of
which the class token's, ``logits[:, 0]``, name the image's class. The loss mask weighs slot
0 only, so the losses and metrics of the token families apply unchanged, and so do the interp
tools that read the head at every position (direct logit attribution, the logit lens).

Trains on ``images`` batches (:mod:`tfmjax.data.images`): ``images`` float32 ``[B,Hi,Wi,C]``
and ``labels`` int32 ``[B]``; the loss is the cross-entropy of the label. It does not
generate, and has no prompts or token ids.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tfmjax.layers.blocks import BlockInputs, EncoderBlock
from tfmjax.layers.dropout import Dropout
from tfmjax.layers.patches import PatchEmbedding, patch_labels
from tfmjax.models.checks import InputError, check_tokens
from tfmjax.models.common import DTYPES, OutputHead, dropout_rate_of, make_stack
from tfmjax.models.encoder_only import EncoderOnly


class PatchEncoder(EncoderOnly):
    """An image classifier: ``images`` in, logits ``[B,1+P,V]`` out (slot 0: the class)."""

    batch_format = "images"
    token_keys = ()
    segment_keys = {}
    prompt_name = "images"

    def setup(self):
        cfg = self.config
        self.embedder = PatchEmbedding(
            cfg.patch_size,
            cfg.num_patches,
            cfg.d_model,
            learned_positions=cfg.position == "learned",
            dtype=DTYPES[cfg.dtype],
            name="embed",
        )
        self.dropout = Dropout(dropout_rate_of(cfg, self.dropout_rate))
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
        x = self.embedder(jnp.asarray(batch["images"]))  # [B, 1+P, D]
        x = self.dropout(x, deterministic=self.deterministic)
        B, T = x.shape[:2]
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        segment_ids = jnp.ones((B, T), jnp.int32)
        x, _ = self.stack(x, None, BlockInputs(positions, segment_ids))
        return self.head(x, None, stage=self.head_stage)  # [B, 1+P, V]; the class token at 0

    @nn.nowrap
    def image_shape(self) -> tuple[int, int, int]:
        """``(Hi, Wi, C)`` of the images this model reads."""
        cfg = self.config
        return cfg.image_size, cfg.image_size, cfg.channels

    @nn.nowrap
    def dummy_batch(self, batch: int = 2, length: int = 8) -> dict:
        """Zero images ``[batch, Hi, Wi, C]`` (``length`` is the image's, not chosen)."""
        del length
        return {"images": jnp.zeros((batch, *self.image_shape()), jnp.float32)}

    @nn.nowrap
    def check_batch(self, batch: dict, trailing_padding: bool = False) -> None:
        """Host: ``images [B,Hi,Wi,C]`` of this model's size, finite; ``labels [B]`` class ids
        (no padding: ``trailing_padding`` has nothing to check)."""
        if "images" not in batch:
            raise InputError(f"an image batch needs key 'images'; got keys {sorted(batch)}")
        images = np.asarray(batch["images"])
        want = self.image_shape()
        if images.ndim != 4 or images.shape[1:] != want:
            raise InputError(
                f"images must be [batch, {want[0]}, {want[1]}, {want[2]}] (model.image_size, "
                f"model.channels), got shape {images.shape}"
            )
        if not np.issubdtype(images.dtype, np.floating) or not np.isfinite(images).all():
            raise InputError(f"images must be finite floats, got dtype {images.dtype}")
        if "labels" in batch:
            labels = np.asarray(batch["labels"])
            if labels.shape != images.shape[:1]:
                raise InputError(
                    f"labels must be [batch] = [{images.shape[0]}], got shape {labels.shape}"
                )
            check_tokens(labels, self.config.vocab_size, "labels")

    @nn.nowrap
    def positions_in(self, batch: dict) -> int:
        """The class token and the patches of every image: ``B (1 + P)``."""
        return len(batch["images"]) * (1 + self.config.num_patches)

    @nn.nowrap
    def targets_and_mask(self, batch: dict):
        """``[B,1+P]`` targets, the label at the class token (slot 0, weight 1.0) and 0 with
        weight 0 at the patches."""
        labels = jnp.asarray(batch["labels"], jnp.int32)
        T = 1 + self.config.num_patches
        first = jnp.arange(T) == 0
        targets = jnp.where(first[None, :], labels[:, None], 0)
        return targets, jnp.broadcast_to(first.astype(jnp.float32), targets.shape)

    @nn.nowrap
    def position_labels(self) -> list[str]:
        """``cls``, ``patch 0 (r0,c0)``, ...: what each slot of the sequence holds."""
        return patch_labels(self.config.image_size, self.config.patch_size)

    @nn.nowrap
    def token_mask(self, ids) -> np.ndarray:
        return np.ones(np.shape(ids), bool)  # no padding: every slot is the image's

    def _cannot(self, what: str) -> Exception:
        return NotImplementedError(
            f"an image classifier (model.input='patches') cannot {what}: it reads images "
            "and names their class"
        )
