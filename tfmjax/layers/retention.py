"""Multi-scale retention, the token mixer of RetNet (Sun et al. 2023), as a self-attention
variant (``model.attention = "retention"``).

``x [B,T,D]`` -> ``q, k, v [B,T,N,H]`` (projections as in :mod:`tfmjax.layers.attention`,
``k`` scaled by ``H^-1/2``; RoPE on ``q`` and ``k`` when the model uses it, RetNet's
rotation without xPos' scaling) -> retention with head ``n``'s decay ``gamma_n = 1 -
2^(-5-n)`` (:mod:`tfmjax.kernels.retention`) -> a GroupNorm per head (over ``H``, own scale
and bias ``[N,H]``) -> times ``swish(x W_G)`` (``W_G [D,N,H]``) -> ``out [N,H,D]``:

    MSR(x) = (swish(x W_G) * GroupNorm(retention_1..N)) W_O        (Sun et al. 2023, eq. 8)

Causal only (there is no bidirectional retention). Training runs the parallel form; decoding
carries the state ``{"s": [B,N,H,H] float32, "index": []}`` and runs the chunkwise form
(a prompt in chunks, then one token per step), never growing with the length. Padding
(segment id 0) is left out of the state; packed rows (segment ids > 1) are not separated.
Keys and values have one head per query head (no GQA).

Hooks (:mod:`tfmjax.layers.hooks`), under the block's ``attn.``:

- ``hook_q``, ``hook_k``, ``hook_v [B,T,N,H]``: the projections (TransformerLens's meaning:
  before RoPE, and ``k`` before its ``H^-1/2`` scale); ``hook_rot_q``, ``hook_rot_k
  [B,T,N,H]``: after RoPE (RoPE models only). The kernel reads ``q̂ = rot(q)`` and ``k̂ =
  rot(k) · H^-1/2`` (padding keys zeroed);
- ``hook_decayed_scores [B,N,T,S]``: the parallel form's ``(Q̂ K̂^T) * D``, ``gamma_n^(t-s)
  (q̂_t . k̂_s)`` (0 for ``s > t`` and padding keys), float32, formed only when asked for;
  the output is then computed from it, so an edit reaches the output (parallel form only);
- ``hook_state [B,N,H,H]``: the recurrent state after the sequence, ``sum_s gamma^(T-1-s)
  k̂_s^T v_s`` (float32), formed only when asked for; nothing in the forward pass reads it
  (a decoding step carries on from it: with a cache it is the new ``s``, and an edit
  changes what later steps see);
- ``hook_z [B,T,N,H]``: each head's retention output, before the GroupNorm;
- ``hook_gate [B,T,N,H]``: ``swish(x W_G)``, which multiplies the GroupNorm's output;
- ``hook_result [B,T,N,D]``: each head's share of the output (``(gate * GroupNorm(z))[n]
  W_O[n]``), before the sum and the bias, formed only when asked for.

No ``hook_pattern``: the decayed scores are not a softmax (rows need not sum to 1, and are
not positive), so head scores refuse retention. QK circuits apply (the score is ``q_t .
k_s`` times a fixed decay); OV circuits do not (the values reach ``W_O`` through a per-head
GroupNorm and an input-dependent gate): see :mod:`tfmjax.interp.circuits`.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.kernels.retention import (
    init_retention_state,
    retention_chunkwise,
    retention_decays,
    retention_from_scores,
    retention_parallel,
    retention_scores,
    retention_state,
)
from tfmjax.layers.attention import head_projections, through_result
from tfmjax.layers.axes import EMBED, HEAD_WIDTH, HEADS, dense_inits, named
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.folded_dot import folded_dot_general
from tfmjax.layers.hooks import hook, wanted
from tfmjax.layers.positions import apply_rope


def group_norm_heads(y, scale, bias, eps: float):
    """GroupNorm with one group per head: ``y [B,T,N,H]`` normalised over ``H`` (float32),
    then ``* scale [N,H] + bias [N,H]``."""
    yf = y.astype(jnp.float32)
    mean = jnp.mean(yf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(yf - mean), axis=-1, keepdims=True)
    return ((yf - mean) * jax.lax.rsqrt(var + eps) * scale[None, None] + bias[None, None]).astype(
        y.dtype
    )


class Retention(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], cache)``: multi-scale retention (causal)."""

    d_model: int
    num_heads: int
    head_dim: int
    attention_bias: bool = True
    rope_base: float | None = None
    rope_layout: str = "interleaved"
    norm_eps: float = 1e-5
    chunk_size: int = 64  # of the chunkwise form (decoding)
    dtype: jnp.dtype = jnp.float32
    qk_ov_circuits: ClassVar[bool] = False
    # The score is q . k times a fixed decay, so the QK circuit applies; the OV circuit does
    # not (tfmjax.interp.circuits).
    qk_circuit: ClassVar[bool] = True
    circuits_refused: ClassVar[str] = (
        "its values pass a per-head GroupNorm and an input-dependent swish gate before the "
        "out kernel"
    )
    causal_only: ClassVar[bool] = True  # no bidirectional form
    bidirectional_only: ClassVar[bool] = False

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        """The block's retention (``num_kv_heads == num_heads``: the config checks it)."""
        return cls(
            c.d_model,
            c.num_heads,
            c.head_dim,
            attention_bias=c.attention_bias,
            rope_base=c.rope_base,
            rope_layout=c.rope_layout,
            norm_eps=c.norm_eps,
            dtype=c.dtype,
            name=name,
        )

    @classmethod
    def init_cache(cls, c: BlockConfig, batch: int, capacity: int) -> dict:
        """One layer's empty state ``s [B,N,H,H]`` (``capacity`` does not matter)."""
        s = init_retention_state(batch, c.num_heads, c.head_dim, c.head_dim)
        return {"s": s, "index": jnp.zeros((), jnp.int32)}

    @classmethod
    def cache_bytes(cls, c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """``B·L·N·H·H`` float32 numbers (no ``S``)."""
        return batch * num_layers * c.num_heads * c.head_dim * c.head_dim * 4

    def setup(self):
        N, H = self.num_heads, self.head_dim
        self.query, self.key, self.value, self.out = head_projections(
            self.d_model, N, N, H, self.attention_bias, self.dtype
        )
        self.gate = nn.DenseGeneral(
            (N, H),
            use_bias=self.attention_bias,
            dtype=self.dtype,
            dot_general=folded_dot_general,
            name="gate",
            **dense_inits((EMBED, HEADS, HEAD_WIDTH), (HEADS, HEAD_WIDTH)),
        )
        self.norm_scale = self.param(
            "norm_scale", named(nn.initializers.ones, HEADS, HEAD_WIDTH), (N, H)
        )
        self.norm_bias = self.param(
            "norm_bias", named(nn.initializers.zeros, HEADS, HEAD_WIDTH), (N, H)
        )

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
            raise ValueError("retention is self-attention without score biases")
        if not causal:
            raise ValueError("retention is causal only: use it as a decoder's self-attention")
        q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (hook(self, f"hook_{n}", a) for n, a in (("q", q), ("k", k), ("v", v)))
        if self.rope_base is not None:
            rope = lambda a: apply_rope(a, q_positions, self.rope_base, self.rope_layout)  # noqa: E731
            q, k = hook(self, "hook_rot_q", rope(q)), hook(self, "hook_rot_k", rope(k))
        k = k * self.head_dim**-0.5
        log_gamma = retention_decays(self.num_heads)
        keep = None if q_segment_ids is None else q_segment_ids != 0
        if cache is None:
            y, new = self._parallel(q, k, v, log_gamma, keep), None
        else:
            y, s = retention_chunkwise(
                cache["s"], q, k, v, log_gamma, kv_mask=keep, chunk_size=self.chunk_size
            )
            new = {"s": hook(self, "hook_state", s), "index": cache["index"] + x.shape[1]}
        y = hook(self, "hook_z", y)
        y = group_norm_heads(y, self.norm_scale, self.norm_bias, self.norm_eps)
        y = hook(self, "hook_gate", nn.silu(self.gate(x))) * y
        if wanted(self, "hook_result"):
            return through_result(self, y), new
        return self.out(y), new

    def _parallel(self, q, k, v, log_gamma, keep):
        """The parallel form ``[B,T,N,H]``; the decayed scores ``[B,N,T,S]`` and the state
        after the sequence ``[B,N,H,H]`` are formed only when their hooks are wanted (the
        output is then the product of the scores, as hooked, with ``v``)."""
        if wanted(self, "hook_state"):
            hook(self, "hook_state", retention_state(k, v, log_gamma, kv_mask=keep))
        if not wanted(self, "hook_decayed_scores"):
            return retention_parallel(q, k, v, log_gamma, kv_mask=keep)
        scores = retention_scores(q, k, log_gamma, kv_mask=keep)
        scores = hook(self, "hook_decayed_scores", scores)
        return retention_from_scores(scores, v).astype(q.dtype)
