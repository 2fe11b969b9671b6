"""Reformer's LSH self-attention (Kitaev et al. 2020) as a self-attention variant
(``model.attention = "lsh"``), causal (decoders) and bidirectional (encoders).

Projections ``query [D,N,H]``, ``value [D,K,H]``, ``out [N,H,D]``: no key projection, the
keys are the unit-normalised queries (shared QK; GQA/MQA on the values by ``K``). RoPE, when
the model uses it, rotates the queries before hashing. The attention is
:func:`tfmjax.kernels.lsh.lsh_attention` (sorted chunks; ``O(T·chunk)``).

Rotations: the paper draws fresh random rotations at every forward; here they are drawn once
from ``model.lsh_seed`` (:func:`tfmjax.kernels.lsh.draw_rotations`, ``[N,R,H,n_buckets/2]``,
the same in every layer, not trained, not stored), so evaluation and decoding are
deterministic and a checkpoint needs nothing more than its config.

Decoding cache ``{"k": [B,N,S,H], "v": [B,K,S,H], "buckets": [B,N,R,S] int32,
"segment_ids": [B,S], "index": []}``: the cached keys are unit queries with their buckets.
A cached call (the prompt's prefill and each step) computes the unchunked LSH attention
(:func:`tfmjax.kernels.lsh.lsh_decode`: every earlier key sharing the query's bucket in some
round), the attention the chunks approximate: chunk membership depends on the whole
sequence, later tokens included, so no cached step can reproduce the chunked forward. The
two agree whenever ``model.lsh_chunk`` covers the sequence.

Hooks, under the block's ``attn.``: ``hook_q [B,T,N,H]``, ``hook_v [B,T,K,H]`` (the
projections), ``hook_rot_q`` (after RoPE), ``hook_z [B,T,N,H]`` and ``hook_result
[B,T,N,D]``. No pattern hook: there is no ``[T,S]`` pattern on the fast path.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels.lsh import draw_rotations, hash_buckets, lsh_attention, lsh_decode, unit_keys
from tfmjax.layers.attention import head_projections, through_result
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.hooks import hook, wanted
from tfmjax.layers.positions import apply_rope


class LSHAttention(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], cache)``: shared-QK LSH self-attention."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    buckets: int = 8  # n_buckets: 1, or even
    rounds: int = 2  # hash rounds R
    chunk: int = 32  # tokens per chunk of the sorted row
    seed: int = 0  # of the fixed rotations
    attention_bias: bool = True
    rope_base: float | None = None
    rope_layout: str = "interleaved"
    scale: float | None = None
    dtype: jnp.dtype = jnp.float32
    qk_ov_circuits: ClassVar[bool] = False  # no key kernel: the keys are normalised queries
    causal_only: ClassVar[bool] = False
    bidirectional_only: ClassVar[bool] = False

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        """The block's LSH self-attention (no sparse pattern, no score biases)."""
        return cls(
            c.d_model,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            buckets=c.lsh_buckets,
            rounds=c.lsh_rounds,
            chunk=c.lsh_chunk,
            seed=c.lsh_seed,
            attention_bias=c.attention_bias,
            rope_base=c.rope_base,
            rope_layout=c.rope_layout,
            scale=c.attention_scale,
            dtype=c.dtype,
            name=name,
        )

    @staticmethod
    def init_cache(c: BlockConfig, batch: int, capacity: int) -> dict:
        """One layer's empty cache (module docstring)."""
        N, K, H, S = c.num_heads, c.num_kv_heads, c.head_dim, capacity
        return {
            "k": jnp.zeros((batch, N, S, H), jnp.float32),
            "v": jnp.zeros((batch, K, S, H), c.dtype),
            "buckets": jnp.zeros((batch, N, c.lsh_rounds, S), jnp.int32),
            "segment_ids": jnp.zeros((batch, S), jnp.int32),
            "index": jnp.zeros((), jnp.int32),
        }

    @staticmethod
    def cache_bytes(c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """``B·L·S·(4·N·H + K·H·bytes + 4·N·R)``: float32 unit keys, values, int32 buckets."""
        size = np.dtype(c.dtype).itemsize
        per_slot = 4 * c.num_heads * c.head_dim + size * c.num_kv_heads * c.head_dim
        return batch * num_layers * capacity * (per_slot + 4 * c.num_heads * c.lsh_rounds)

    def setup(self):
        sizes = (self.d_model, self.num_heads, self.num_kv_heads, self.head_dim)
        self.query, _, self.value, self.out = head_projections(
            *sizes, self.attention_bias, self.dtype
        )

    def rotations(self):
        """The fixed ``[N,R,H,n_buckets/2]`` rotations (module docstring)."""
        return draw_rotations(self.seed, self.num_heads, self.rounds, self.head_dim, self.buckets)

    def __call__(
        self,
        x,
        context=None,
        *,
        q_positions,
        kv_positions=None,
        q_segment_ids=None,
        kv_segment_ids=None,
        causal=False,
        alibi_slopes=None,
        bias=None,
        cache=None,
        kv=None,
    ):
        if context is not None or kv is not None or alibi_slopes is not None or bias is not None:
            raise ValueError("lsh attention is self-attention without score biases")
        q = hook(self, "hook_q", self.query(x))
        v = hook(self, "hook_v", self.value(x))
        if self.rope_base is not None:
            q = apply_rope(q, q_positions, self.rope_base, self.rope_layout)
            q = hook(self, "hook_rot_q", q)
        if cache is None:
            out = lsh_attention(
                q,
                v,
                self.rotations(),
                chunk=self.chunk,
                causal=causal,
                mask=None if kv_segment_ids is None else kv_segment_ids != 0,
                segment_ids=kv_segment_ids,
                scale=self.scale,
            )
        else:
            out, cache = self._cached(q, v, q_segment_ids, cache)
        out = hook(self, "hook_z", out)
        if wanted(self, "hook_result"):
            return through_result(self, out), cache
        return self.out(out), cache

    def _cached(self, q, v, segment_ids, cache):
        """Write the new unit keys, values and buckets at ``index``; attend unchunked."""
        i, T = cache["index"], q.shape[1]
        buckets = hash_buckets(q, self.rotations())  # [B,N,R,T]
        seg = jnp.ones(q.shape[:2], jnp.int32) if segment_ids is None else segment_ids
        update = jax.lax.dynamic_update_slice
        new = dict(
            cache,
            k=update(cache["k"], jnp.swapaxes(unit_keys(q), 1, 2), (0, 0, i, 0)),
            v=update(cache["v"], jnp.swapaxes(v, 1, 2).astype(cache["v"].dtype), (0, 0, i, 0)),
            buckets=update(cache["buckets"], buckets, (0, 0, 0, i)),
            segment_ids=update(cache["segment_ids"], seg.astype(jnp.int32), (0, i)),
            index=i + T,
        )
        slots = jnp.broadcast_to(i + jnp.arange(T), q.shape[:2])
        out = lsh_decode(
            q,
            new["k"],
            new["v"],
            buckets,
            new["buckets"],
            q_positions=slots,
            kv_segment_ids=new["segment_ids"],
            scale=self.scale,
        )
        return out, new
