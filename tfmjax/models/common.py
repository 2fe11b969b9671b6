"""Pieces the model families share: embedding with positions, output head, shifting, extras."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.config import DTYPES as config_dtypes
from tfmjax.config import ModelConfig
from tfmjax.layers.blocks import BlockConfig
from tfmjax.layers.embeddings import TokenEmbedding
from tfmjax.layers.norms import make_norm
from tfmjax.layers.positions import LearnedPositions, RelativePositionBias, alibi_slopes, sinusoidal
from tfmjax.layers.stack import LayerStack

DTYPES = {name: jnp.dtype(name) for name in config_dtypes}  # model.dtype -> compute dtype


def block_config(cfg: ModelConfig) -> BlockConfig:
    """The block hyper-parameters of a model config."""
    return BlockConfig(
        d_model=cfg.d_model,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.kv_heads,
        head_dim=cfg.head_width,
        d_ff=cfg.d_ff,
        activation=cfg.activation,
        norm=cfg.norm,
        norm_position=cfg.norm_position,
        norm_eps=cfg.norm_eps,
        use_bias=cfg.use_bias,
        dropout_rate=cfg.dropout_rate,
        rope_base=cfg.rope_base if cfg.position == "rope" else None,
        window=cfg.window,
        attention_impl=cfg.attention_impl,
        dtype=DTYPES[cfg.dtype],
    )


def make_stack(cfg: ModelConfig, block, num_layers: int, deterministic: bool, name: str, **kw):
    """A :class:`LayerStack` of ``block`` configured from ``cfg``."""
    return LayerStack(
        block,
        {"cfg": block_config(cfg), "deterministic": deterministic, **kw},
        num_layers,
        scan=cfg.scan_layers,
        remat=cfg.remat,
        name=name,
    )


def shift_right(tokens, segment_ids, bos_id: int):
    """Teacher forcing: ``inputs[t] = tokens[t-1]``, BOS at each segment start. ``[B,T]``."""
    previous = jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]
    prev_segment = jnp.pad(segment_ids, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
    return jnp.where(prev_segment == segment_ids, previous, bos_id).astype(tokens.dtype)


def segment_positions(segment_ids):
    """Position of each token inside its segment (packed rows restart at 0). ``[B,T]``."""
    T = segment_ids.shape[1]
    idx = jnp.broadcast_to(jnp.arange(T), segment_ids.shape)
    starts = jnp.pad(
        segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=True
    )
    start_idx = jnp.where(starts, idx, 0)
    return idx - jax.lax.cummax(start_idx, axis=1)


def positions_from_segments(segment_ids):
    """Positions of right-padded rows: ``0..n-1`` on the tokens, 0 on the padding. ``[B,T]``."""
    positions = jnp.cumsum(segment_ids, axis=1) - 1
    return jnp.where(segment_ids > 0, positions, 0).astype(jnp.int32)


def padding_segments(tokens):
    """Segment ids that mark padding only: 1 for tokens, 0 for the pad id 0. ``[B,T]``."""
    return (tokens != 0).astype(jnp.int32)


class Embedder(nn.Module):
    """Token embedding (optionally x sqrt(D)) + absolute positions, dropout. ``[B,T,D]``."""

    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        self.tokens = TokenEmbedding(
            cfg.vocab_size, cfg.d_model, DTYPES[cfg.dtype], name="token_embed"
        )
        if cfg.position == "learned":
            self.learned = LearnedPositions(cfg.max_len, cfg.d_model, name="pos_embed")
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, ids, positions, *, deterministic: bool):
        cfg = self.cfg
        x = self.tokens(ids)
        if cfg.scale_embeddings:
            x = x * jnp.sqrt(float(cfg.d_model)).astype(x.dtype)
        if cfg.position == "sinusoidal":
            x = x + sinusoidal(positions, cfg.d_model).astype(x.dtype)
        elif cfg.position == "learned":
            x = x + self.learned(positions).astype(x.dtype)
        return self.dropout(x, deterministic=deterministic)

    def attend(self, x):
        return self.tokens.attend(x)


class OutputHead(nn.Module):
    """Final norm (pre-norm models) and the projection to logits ``[B,T,V]`` (float32)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, embedder: Embedder):
        cfg = self.cfg
        if cfg.norm_position == "pre":
            x = make_norm(cfg.norm, cfg.norm_eps, name="final_norm")(x)
        if cfg.tie_embeddings:
            return embedder.attend(x)
        return nn.Dense(cfg.vocab_size, use_bias=False, dtype=DTYPES[cfg.dtype], name="lm_head")(
            x
        ).astype(jnp.float32)


class PositionExtras(nn.Module):
    """Attention-score extras: ALiBi slopes ``[N]`` and/or a relative bias ``[1,N,T,S]``."""

    cfg: ModelConfig
    bidirectional: bool

    @nn.compact
    def __call__(self, q_len: int, kv_len: int, q_offset=0):
        cfg = self.cfg
        if cfg.position == "alibi":
            return alibi_slopes(cfg.num_heads), None
        if cfg.position == "relative":
            rel = RelativePositionBias(
                cfg.num_heads,
                cfg.relative_buckets,
                cfg.relative_max_distance,
                self.bidirectional,
                name="relative_bias",
            )
            return None, rel(jnp.arange(q_len) + q_offset, jnp.arange(kv_len))
        return None, None
