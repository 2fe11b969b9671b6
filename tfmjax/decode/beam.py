"""Beam search as one ``lax.while_loop`` over a beam-flattened KV cache.

Layout: the ``W`` beams of batch item ``b`` are cache rows ``b*W .. b*W + W-1`` (the prompt
is prefilled once per item, then each cache row is repeated ``W`` times). Scores are kept as
``[B,W]``. Each step, for every item:

1. the ``W*V`` continuations ``alive_lp[w] + log p(v)`` are ranked and the best ``2W`` kept
   (at least ``W`` of them do not end in EOS);
2. a candidate that ends in EOS, or reaches ``max_new_tokens``, and ranks in the first ``W``
   joins the finished pool with score ``log P / lp(len)``, ``lp(n) = ((5+n)/6)^alpha``
   (the rank rule is Hugging Face's; it makes ``beam_size=1, alpha=0`` exactly greedy);
3. the best ``W`` non-EOS candidates become the alive beams; the cache rows follow their
   parents (:meth:`KVCache.reorder`) and their last tokens are fed.

An item is finished when its best alive beam cannot beat its best finished hypothesis even
at the longest length (``alive_lp / lp(max_new_tokens) < best``, valid for ``alpha >= 0``);
the loop stops when every item is. Returns the best finished hypothesis of each item.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from tfmjax.decode.loop import GenerateOutput

NEG = -1.0e9  # the score of an empty slot (finite: no inf - inf)


class _Beams(NamedTuple):
    t: Any
    alive_seq: Any  # [B,W,M]
    alive_lp: Any  # [B,W]
    fin_seq: Any  # [B,W,M]
    fin_score: Any  # [B,W] length-penalised, sorted descending
    fin_lp: Any  # [B,W]
    fin_len: Any  # [B,W]
    done: Any  # [B]
    logits: Any  # [B*W,V]
    cache: Any  # B*W rows


def _gather(x, idx):
    """``x [B,C,...]``, ``idx [B,C']`` -> ``x[b, idx[b, c]]`` of shape ``[B,C',...]``."""
    return jax.vmap(lambda row, i: row[i])(x, idx)


def _select(s: _Beams, strategy, max_new_tokens: int, eos_id):
    """Grow every beam by one token; returns (state, fed tokens [B*W], parent rows [B*W])."""
    B, W, _ = s.alive_seq.shape
    V = s.logits.shape[-1]
    log_p = jax.nn.log_softmax(s.logits, axis=-1).reshape(B, W, V)
    cand = (s.alive_lp[:, :, None] + log_p).reshape(B, W * V)
    top_lp, top_idx = jax.lax.top_k(cand, 2 * W)  # [B,2W]
    parent, token = top_idx // V, (top_idx % V).astype(jnp.int32)
    seqs = _gather(s.alive_seq, parent).at[:, :, s.t].set(token)  # [B,2W,M]
    is_eos = token == eos_id
    length = s.t + 1
    finishing = (is_eos | (length == max_new_tokens)) & (jnp.arange(2 * W) < W)[None, :]
    cand_score = jnp.where(finishing, top_lp / strategy.length_penalty(length), NEG)

    pool_score = jnp.concatenate([s.fin_score, cand_score], axis=1)
    fin_score, pick = jax.lax.top_k(pool_score, W)
    fin_seq = _gather(jnp.concatenate([s.fin_seq, seqs], axis=1), pick)
    fin_lp = _gather(jnp.concatenate([s.fin_lp, top_lp], axis=1), pick)
    cand_len = jnp.broadcast_to(length, (B, 2 * W)).astype(jnp.int32)
    fin_len = _gather(jnp.concatenate([s.fin_len, cand_len], axis=1), pick)

    alive_lp, keep = jax.lax.top_k(jnp.where(is_eos, NEG, top_lp), W)  # [B,W]
    alive_seq = _gather(seqs, keep)
    fed = _gather(token, keep).reshape(B * W)
    rows = (_gather(parent, keep) + W * jnp.arange(B)[:, None]).reshape(B * W)
    bound = alive_lp[:, 0] / strategy.length_penalty(max_new_tokens)
    done = s.done | (bound < fin_score[:, 0])
    s = s._replace(
        alive_seq=alive_seq,
        alive_lp=alive_lp,
        fin_seq=fin_seq,
        fin_score=fin_score,
        fin_lp=fin_lp,
        fin_len=fin_len,
        done=done,
    )
    return s, fed, rows


def beam_search(step_fn, logits, cache, strategy, max_new_tokens: int, eos_id):
    """``logits [B,V]`` and ``cache`` (B rows) from prefill; ``step_fn`` as in the sample loop."""
    B, V = logits.shape
    W, M = strategy.beam_size, max_new_tokens
    zeros_bw = jnp.zeros((B, W), jnp.float32)
    s = _Beams(
        t=jnp.zeros((), jnp.int32),
        alive_seq=jnp.zeros((B, W, M), jnp.int32),
        alive_lp=zeros_bw.at[:, 1:].set(NEG),
        fin_seq=jnp.zeros((B, W, M), jnp.int32),
        fin_score=zeros_bw + NEG,
        fin_lp=zeros_bw,
        fin_len=jnp.zeros((B, W), jnp.int32),
        done=jnp.zeros((B,), bool),
        logits=jnp.repeat(logits, W, axis=0),
        cache=cache.repeat(W),
    )

    def cond(s):
        return (s.t < M - 1) & ~jnp.all(s.done)

    def body(s):
        s, fed, rows = _select(s, strategy, M, eos_id)
        logits, cache = step_fn(s.cache.reorder(rows), fed)
        return s._replace(t=s.t + 1, logits=logits, cache=cache)

    s = jax.lax.while_loop(cond, body, s)
    s, _, _ = _select(s, strategy, M, eos_id)
    return GenerateOutput(s.fin_seq[:, 0], s.fin_len[:, 0], s.fin_lp[:, 0], s.fin_score[:, 0])
