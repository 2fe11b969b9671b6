"""Pieces the model families share: embedding with positions, output head, shifting, extras."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.config import DTYPES as config_dtypes
from tfmjax.config import ModelConfig
from tfmjax.kernels.masks import RandomBlocks
from tfmjax.layers.attention_variants import ATTENTION_VARIANTS, BIDIRECTIONAL_ONLY, CAUSAL_ONLY
from tfmjax.layers.axes import BATCH, EMBED, LENGTH, VOCAB, constrain, dense_inits, named
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.dropout import Dropout
from tfmjax.layers.embeddings import TokenEmbedding, VocabProjection, pad_vocab
from tfmjax.layers.hooks import hook
from tfmjax.layers.mlp import PLAIN
from tfmjax.layers.norms import make_norm
from tfmjax.layers.positions import (
    FireBias,
    LearnedPositions,
    RelativePositionBias,
    alibi_row_bias,
    alibi_slopes,
    digit_runs,
    evaluation_position_table,
    randomized_positions,
    sinusoidal,
    windowed_places,
)
from tfmjax.layers.reversible import ReversibleStack
from tfmjax.layers.stack import LayerStack

DTYPES = {name: jnp.dtype(name) for name in config_dtypes}  # model.dtype -> compute dtype


def random_blocks_of(cfg: ModelConfig) -> RandomBlocks | None:
    """BigBird's random blocks of the config (None when ``model.random_blocks`` is 0); a
    bidirectional draw ranges over the blocks of ``model.max_len`` positions."""
    if not cfg.random_blocks:
        return None
    size = cfg.random_block_size
    return RandomBlocks(cfg.random_blocks, size, cfg.random_blocks_seed, -(-cfg.max_len // size))


def block_config(cfg: ModelConfig, dropout_rate=None) -> BlockConfig:
    """The block hyper-parameters of a model config, under the config's own names (its
    defaults resolved: ``head_dim`` is ``cfg.head_width``, ``kv_rank`` ``cfg.latent_kv_rank``,
    ...); ``dropout_rate``, if given, in place of ``cfg.dropout_rate`` (see
    :func:`dropout_rate_of`)."""
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
        attention_bias=cfg.attention_uses_bias,
        mlp_bias=cfg.mlp_uses_bias,
        dropout_rate=dropout_rate_of(cfg, dropout_rate),
        rope_base=cfg.rope_base if cfg.position == "rope" else None,
        rope_layout=cfg.rope_layout,
        window=cfg.window,
        attention_stride=cfg.attention_stride,
        global_tokens=cfg.global_tokens,
        random_blocks=random_blocks_of(cfg),
        attention=cfg.attention,
        kv_rank=cfg.latent_kv_rank,
        q_rank=cfg.q_rank,
        rope_dim=cfg.mla_rope_dim,
        feature_map=cfg.feature_map,
        num_features=cfg.num_features,
        ssm_state=cfg.ssm_state,
        ssm_expand=cfg.ssm_expand,
        ssm_conv=cfg.ssm_conv,
        num_landmarks=cfg.num_landmarks,
        nystrom_conv=cfg.nystrom_conv,
        max_len=cfg.max_len,
        linformer_rank=cfg.linformer_rank,
        linformer_share_kv=cfg.linformer_share_kv,
        lsh_buckets=cfg.lsh_buckets,
        lsh_rounds=cfg.lsh_rounds,
        lsh_chunk=cfg.lsh_chunk,
        lsh_seed=cfg.lsh_seed,
        scale_attention=cfg.scale_attention,
        attention_impl=cfg.attention_impl,
        moe_experts=cfg.moe_experts,
        moe_top_k=cfg.moe_top_k,
        moe_capacity_factor=cfg.moe_capacity_factor,
        moe_eval_capacity_factor=cfg.moe_eval_capacity,
        moe_renormalize=cfg.moe_renormalizes,
        dtype=DTYPES[cfg.dtype],
    )


def dropout_rate_of(cfg: ModelConfig, override=None):
    """``cfg.dropout_rate``, or ``override`` when given: a family's ``dropout_rate`` field, a
    traced per-run rate when :mod:`tfmjax.train.stacked` trains runs with their own rates
    as one program (:class:`tfmjax.layers.dropout.Dropout` takes it)."""
    return cfg.dropout_rate if override is None else override


def init_self_attention_cache(cfg: ModelConfig, batch: int, capacity: int) -> dict:
    """One layer's empty decoding cache for the decoder's variant (its module's
    ``init_cache``: e.g. keys and values ``[B,K,S,H]`` for softmax)."""
    c = decoder_block_config(cfg)
    return ATTENTION_VARIANTS[c.attention].init_cache(c, batch, capacity)


def cache_bytes(cfg: ModelConfig, batch: int, num_layers: int, capacity: int) -> int:
    """Bytes of the self-attention decoding cache of ``num_layers`` layers (segment ids and
    indices aside), by the formula of the decoder's variant (its ``cache_bytes``)."""
    c = decoder_block_config(cfg)
    return ATTENTION_VARIANTS[c.attention].cache_bytes(c, batch, num_layers, capacity)


def encoder_block_config(cfg: ModelConfig, dropout_rate=None) -> BlockConfig:
    """The block config of an encoder: a causal-only self-mixer (retention, selective_scan,
    rwkv) has no bidirectional form, so an encoder keeps softmax self-attention."""
    c = block_config(cfg, dropout_rate)
    return c._replace(attention="softmax") if c.attention in CAUSAL_ONLY else c


def decoder_block_config(cfg: ModelConfig, dropout_rate=None) -> BlockConfig:
    """The block config of a decoder: a bidirectional-only self-attention (nystrom,
    linformer) has no causal form, so a decoder keeps softmax self-attention (the config
    refuses it in a decoder_only model)."""
    c = block_config(cfg, dropout_rate)
    return c._replace(attention="softmax") if c.attention in BIDIRECTIONAL_ONLY else c


def make_stack(
    cfg: ModelConfig,
    block,
    num_layers: int,
    deterministic: bool,
    name: str,
    dropout_rate=None,
    encoder: bool = False,
    **kw,
):
    """A :class:`LayerStack` of ``block`` configured from ``cfg`` (by
    :func:`encoder_block_config` or :func:`decoder_block_config`): with
    ``model.moe_experts``, every ``model.moe_every``-th block's feed-forward is a mixture of
    experts. ``dropout_rate``: see :func:`dropout_rate_of`."""
    configure = encoder_block_config if encoder else decoder_block_config
    if cfg.reversible:  # the config keeps it to self-attention blocks, unrolled and dense
        block_kwargs = {"cfg": configure(cfg, dropout_rate), "deterministic": deterministic, **kw}
        return ReversibleStack(block_kwargs, num_layers, name=name)
    return LayerStack(
        block,
        {"cfg": configure(cfg, dropout_rate), "deterministic": deterministic, **kw},
        num_layers,
        scan=cfg.scan_layers,
        remat=cfg.remat,
        every=cfg.moe_every,
        every_kwargs={"moe": True} if cfg.moe_experts else None,
        name=name,
    )


def layer_period(cfg: ModelConfig) -> int:
    """Layers per scanned group of a stack (:class:`LayerStack` ``period``): ``moe_every``
    when only some blocks are mixtures, else 1."""
    return cfg.moe_every if cfg.moe_experts and cfg.moe_every > 1 else 1


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


def token_positions(module: nn.Module, segment_ids, cfg: ModelConfig, deterministic: bool):
    """The positions of a batch's tokens ``[B,T]``: ``0..n-1`` per segment, or, training
    under ``model.position_sampling = "randomized"``, a sorted random subset of
    ``[0, model.max_position)`` per row (Ruoss et al. 2023) drawn from the step's dropout
    key (``fold_in(root, step)``: a resumed run draws the same)."""
    index = segment_positions(segment_ids)
    if deterministic or not cfg.randomizes_token_positions or module.is_initializing():
        return index
    lengths = jnp.max(jnp.where(segment_ids > 0, index + 1, 0), axis=1)
    return randomized_positions(module.make_rng("dropout"), index, lengths, cfg.position_rows)


def seen_positions(cfg: ModelConfig, positions, deterministic: bool, width: int):
    """The positions the encodings read: under ``model.position_sampling = "randomized"``
    at evaluation and decoding (``deterministic``), the ordered positions ``[B,T]`` of a
    sequence ``width`` slots wide (the input's, or the KV cache's) read through
    :func:`tfmjax.layers.positions.evaluation_position_table`; else unchanged. Training
    rows already carry their random draw (:func:`token_positions`)."""
    if not deterministic or not cfg.randomizes_token_positions or positions is None:
        return positions
    table = jnp.asarray(evaluation_position_table(width, cfg.position_rows))
    return table[jnp.clip(positions, 0, width - 1)]


def draw_abacus_places(module: nn.Module, cfg: ModelConfig, deterministic: bool, *sides):
    """The training map of Abacus places ``[B,R]`` over the ``R = max_len +
    abacus_max_offset`` place rows: a digit at place ``p`` reads row ``map[b, p]`` (``map[:,
    0] = 0``: not a digit). Ordered sampling: ``p + o``, one offset ``o`` uniform in ``[0,
    abacus_max_offset)`` per row (McLeish et al. 2024). Randomized: :func:`windowed_places`
    with ``K`` the row's longest number in any of ``sides`` (the ``[B,T]`` ids the map
    serves) and ``model.abacus_spread``. From the ``dropout`` stream; None at evaluation,
    at init and for another encoding (places then stay ``p``)."""
    if cfg.position != "abacus" or deterministic or module.is_initializing():
        return None
    key = module.make_rng("dropout")
    rows = cfg.max_len + cfg.abacus_max_offset
    if cfg.position_sampling == "randomized":
        runs = [digit_runs(ids, cfg.digit_first_id).max(axis=1) for ids in sides]
        return windowed_places(key, jnp.max(jnp.stack(runs), axis=0), cfg.abacus_spread, rows)
    place = jnp.arange(rows, dtype=jnp.int32)[None, :]
    offset = jax.random.randint(key, (sides[0].shape[0], 1), 0, cfg.abacus_max_offset)
    return jnp.where(place > 0, place + offset, 0)


def abacus_places(
    module: nn.Module,
    ids,
    cfg: ModelConfig,
    deterministic: bool,
    carry=None,
    place_map=None,
    side="decoder",
):
    """Abacus places of ``ids [B,T]`` (:func:`digit_runs`; an encoder's counted from each
    number's end with ``model.abacus_count_from = "end"``), read while training through
    ``place_map [B,R]`` (:func:`draw_abacus_places`): given when an encoder-decoder draws
    one for both sides, so an operand digit and the answer digit of the same place value
    keep equal places, else drawn here."""
    from_end = side == "encoder" and cfg.abacus_count_from == "end"
    places = digit_runs(ids, cfg.digit_first_id, carry, from_end=from_end)
    if place_map is None:
        place_map = draw_abacus_places(module, cfg, deterministic, ids)
    if place_map is None:
        return places
    return jnp.take_along_axis(place_map, places, axis=1)


def padding_segments(tokens, pad_id: int | None):
    """Segment ids that mark padding only: 0 where ``tokens == pad_id``, else 1. ``[B,T]``.

    ``pad_id`` is ``model.pad_id``; None (a vocabulary without a padding id, e.g. GPT-2):
    every id is a token, and padding must come as explicit segment ids or lengths."""
    if pad_id is None:
        return jnp.ones(tokens.shape, jnp.int32)
    return (tokens != pad_id).astype(jnp.int32)


class Embedder(nn.Module):
    """Token embedding (optionally x sqrt(D)) + absolute positions (+ token types), an
    optional norm, dropout. ``[B,T,D]``.

    ``side="decoder"`` with ``model.per_side_embeddings``: the decoder's own position table
    and norm (the token table is always shared). Hooks: ``{side}.hook_embed`` (the scaled
    token embedding) and ``{side}.hook_pos_embed`` (absolute positions).
    """

    cfg: ModelConfig
    dropout_rate: Any = None  # in place of cfg.dropout_rate (dropout_rate_of)

    def setup(self):
        cfg = self.cfg
        self.tokens = TokenEmbedding(
            cfg.vocab_size, cfg.d_model, DTYPES[cfg.dtype], name="token_embed"
        )
        rows = cfg.position_rows + cfg.position_offset
        sides = ("", "decoder_") if cfg.per_side_embeddings else ("",)
        if cfg.position == "learned":
            self.learned = [
                LearnedPositions(rows, cfg.d_model, name=f"{s}pos_embed") for s in sides
            ]
        if cfg.position == "abacus":  # places 1..max_len, plus the offset; 0: not a digit
            rows = cfg.max_len + cfg.abacus_max_offset
            self.learned = [
                LearnedPositions(rows, cfg.d_model, name=f"{s}abacus_embed") for s in sides
            ]
        if cfg.type_vocab_size:
            init = named(nn.linear.default_embed_init, None, EMBED)
            self.types = nn.Embed(
                cfg.type_vocab_size, cfg.d_model, embedding_init=init, name="type_embed"
            )
        if cfg.embed_norm:
            self.norms = [make_norm(cfg.norm, cfg.norm_eps, name=f"{s}embed_norm") for s in sides]
        self.dropout = Dropout(dropout_rate_of(cfg, self.dropout_rate))

    def __call__(
        self,
        ids,
        positions,
        *,
        deterministic: bool,
        token_types=None,
        side="encoder",
        carry=None,
        abacus_map=None,
    ):
        """``ids, positions [B,T]``; ``token_types [B,T]`` (default 0) if ``type_vocab_size``;
        ``carry [B]``: abacus place of the token before ``ids`` (cached decoding);
        ``abacus_map [B,R]``: training places shared with the other side (else drawn)."""
        cfg = self.cfg
        own = int(cfg.per_side_embeddings and side == "decoder")
        x = self.tokens(ids)
        if cfg.scale_embeddings:
            x = x * jnp.sqrt(float(cfg.d_model)).astype(x.dtype)
        x = hook(self, f"{side}.hook_embed", x)
        if cfg.position == "sinusoidal":
            pe = sinusoidal(positions, cfg.d_model, layout=cfg.sinusoidal_layout)
            x = x + hook(self, f"{side}.hook_pos_embed", pe.astype(x.dtype))
        elif cfg.position == "learned":
            pe = self.learned[own](positions + cfg.position_offset).astype(x.dtype)
            x = x + hook(self, f"{side}.hook_pos_embed", pe)
        elif cfg.position == "abacus":
            places = abacus_places(self, ids, cfg, deterministic, carry, abacus_map, side)
            pe = self.learned[own](places).astype(x.dtype)
            x = x + hook(self, f"{side}.hook_pos_embed", pe)
        if cfg.type_vocab_size:
            types = jnp.zeros_like(ids) if token_types is None else token_types
            x = x + self.types(types).astype(x.dtype)
        if cfg.embed_norm:
            x = self.norms[own](x)
        return self.dropout(x, deterministic=deterministic)

    def attend(self, x, columns: int | None = None):
        return self.tokens.attend(x, columns)


class OutputHead(nn.Module):
    """Final norm (pre-norm models), the optional masked-LM transform, the projection to
    logits ``[B,T,V]`` (float32) and the optional logit bias. Its hooks are named under
    ``head_stack``, the stack it reads (``decoder.ln_final.hook_scale``).

    ``stage``: ``"all"`` (the stack's output -> logits), ``"inputs"`` (-> the projection's
    input ``[B,T,D]``: norm and transform applied) or ``"project"`` (that input -> logits),
    so a loss can project a few positions at a time (:mod:`tfmjax.train.chunked_loss`).
    The projection runs over ``model.projected_vocab`` columns; those past V never leave."""

    cfg: ModelConfig
    head_stack: str = "decoder"

    @nn.compact
    def __call__(self, x, embedder: Embedder, stage: str = "all"):
        cfg = self.cfg
        dtype = DTYPES[cfg.dtype]
        if stage != "project":
            if cfg.norm_position == "pre":
                x = make_norm(cfg.norm, cfg.norm_eps, name="final_norm")(x)
            if cfg.mlm_head:
                dense = nn.Dense(
                    cfg.d_model,
                    dtype=dtype,
                    name="mlm_dense",
                    **dense_inits((EMBED, None), (None,)),
                )
                x = PLAIN[cfg.activation](dense(x))
                x = make_norm(cfg.norm, cfg.norm_eps, name="mlm_norm")(x)
        if stage == "inputs":
            return x
        columns = cfg.projected_vocab
        if cfg.tie_embeddings:
            if cfg.scale_tied_output:
                x = x * jnp.asarray(cfg.d_model**-0.5, x.dtype)
            logits = embedder.attend(x, columns)
        else:
            head = VocabProjection(cfg.vocab_size, columns, dtype=dtype, name="lm_head")
            logits = constrain(head(x).astype(jnp.float32), BATCH, LENGTH, VOCAB)
        if cfg.output_bias:
            bias = self.param("output_bias", named(nn.initializers.zeros, VOCAB), (cfg.vocab_size,))
            logits = logits + pad_vocab(bias, 0, columns).reshape(1, 1, -1)
        return logits[..., : cfg.vocab_size] if columns > cfg.vocab_size else logits


class PositionExtras(nn.Module):
    """Attention-score extras: ALiBi slopes ``[N]`` and/or a dense bias ``[1|B,N,T,S]``
    (T5 relative, FIRE; ALiBi under randomized positions)."""

    cfg: ModelConfig
    bidirectional: bool
    deterministic: bool = True

    @nn.compact
    def __call__(self, q_len: int, kv_len: int, q_offset=0, positions=None, cached=False):
        """``positions [B,T]``: the queries' positions (ordered ones at evaluation). Uncached
        self-attention: the keys' too. ``cached``: the keys are the cache's slots, which share
        the last query's shift from slot to position (prompts are left-padded, decoded
        positions consecutive). Randomized sampling at evaluation reads both through
        :func:`seen_positions`, so the distances are dense, cached or not."""
        cfg = self.cfg
        sampled = cfg.randomizes_token_positions
        randomized = sampled and (not cached or self.deterministic)
        if positions is not None and (cached or q_len != kv_len):
            shift = positions[:, -1:] - (q_offset + q_len - 1)  # [B,1]
            kv_pos = jnp.arange(kv_len)[None, :] + shift
        else:
            kv_pos = positions
        if sampled and positions is not None:
            positions = seen_positions(cfg, positions, self.deterministic, kv_len)
            kv_pos = seen_positions(cfg, kv_pos, self.deterministic, kv_len)
        if cfg.position == "alibi":
            if randomized and positions is not None:
                return None, alibi_row_bias(alibi_slopes(cfg.num_heads), positions, kv_pos)
            return alibi_slopes(cfg.num_heads), None
        if cfg.position == "relative":
            rel = RelativePositionBias(
                cfg.num_heads,
                cfg.relative_buckets,
                cfg.relative_max_distance,
                self.bidirectional,
                name="relative_bias",
            )
            if randomized and positions is not None:
                return None, rel(positions, kv_pos)
            return None, rel(jnp.arange(q_len) + q_offset, jnp.arange(kv_len))
        if cfg.position == "fire":
            threshold = cfg.max_len if cfg.fire_threshold is None else cfg.fire_threshold
            fire = FireBias(
                cfg.num_heads, cfg.fire_hidden, float(threshold), self.bidirectional, name="fire"
            )
            return None, fire(positions, kv_pos)
        return None, None
