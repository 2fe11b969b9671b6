"""Multi-head latent attention (MLA; DeepSeek-AI, DeepSeek-V2, 2024).

Keys and values are rebuilt from one low-rank latent per token, ``c = RMSNorm(x W_dkv)``
``[B,T,R]`` (``R = kv_rank``, much smaller than ``N·H``): ``k_nope = c W_uk [B,T,N,H-Hr]``,
``v = c W_uv [B,T,N,H]``. Queries come from their own latent, ``q = RMSNorm(x W_dq) W_uq``
(or straight from ``x`` when ``q_rank`` is None). RoPE is decoupled: the last ``Hr``
(``rope_dim``) features of every query head are rotated, and they meet one rotated key
``k_rope = RoPE(x W_kr) [B,T,Hr]`` shared by all heads, so the latent itself never carries
positions. Scores ``(q_nope·k_nope + q_rope·k_rope) · scale``, ``scale = 1/sqrt(H)``.

Training runs that as ordinary attention over ``N`` heads. Decoding caches only
``[c ; k_rope]`` per token (``R + Hr`` numbers per layer instead of ``2·K·H``) and absorbs
the up-projections: ``q_nope·(c W_uk) = (q_nope W_ukᵀ)·c``, so queries are moved into the
latent space, ``q_abs = [q_nope W_ukᵀ ; q_rope] [B,T,N,R+Hr]``, and attend as multi-query
attention over the cache (one key/value "head" ``[c ; k_rope]``, the same array serving as
values); the first ``R`` output features are ``Σ p c``, which ``W_uv`` and ``W_o`` take back
to the model width. Both forms compute the same function (tests compare them).

Cache of one layer: ``{"k": [B,1,S,R+Hr], "segment_ids": [B,S], "index": []}``, head-major
like :mod:`tfmjax.layers.attention`'s (no ``"v"``: the latent is both).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels import attention as attention_fn
from tfmjax.kernels.masks import RandomBlocks
from tfmjax.layers.attention import sparse_pattern, write_cache
from tfmjax.layers.axes import EMBED, HEAD_WIDTH, HEADS, dense_inits, named
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.norms import RMSNorm
from tfmjax.layers.positions import apply_rope


def init_latent_cache(batch: int, max_len: int, kv_rank: int, rope_dim: int, dtype=jnp.float32):
    """An empty MLA cache for one layer: the latent and the shared RoPE key per slot."""
    return {
        "k": jnp.zeros((batch, 1, max_len, kv_rank + rope_dim), dtype),
        "segment_ids": jnp.zeros((batch, max_len), jnp.int32),
        "index": jnp.zeros((), jnp.int32),
    }


def _up_init():
    return nn.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=0, out_axis=(1, 2)
    )


class LatentAttention(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], cache)``: MLA self-attention (see the module docstring)."""

    d_model: int
    num_heads: int
    head_dim: int
    kv_rank: int
    q_rank: int | None = None  # None: queries straight from x
    rope_dim: int = 0  # decoupled RoPE features per head (0: no RoPE)
    attention_bias: bool = True  # of the down-projections and the output projection
    rope_base: float = 10000.0
    rope_layout: str = "interleaved"
    window: int | None = None
    attention_stride: int | None = None
    global_tokens: int = 0
    random_blocks: RandomBlocks | None = None
    scale: float | None = None
    impl: str = "auto"
    norm_eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    qk_ov_circuits: ClassVar[bool] = False  # keys and values come from a shared latent
    causal_only: ClassVar[bool] = False  # also bidirectional (encoders)
    bidirectional_only: ClassVar[bool] = False  # also causal (decoders)

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        """The block's MLA self-attention (RoPE base 10000 when the model has none)."""
        return cls(
            c.d_model,
            c.num_heads,
            c.head_dim,
            c.kv_rank,
            q_rank=c.q_rank,
            rope_dim=c.rope_dim,
            attention_bias=c.attention_bias,
            rope_base=c.rope_base or 10000.0,
            rope_layout=c.rope_layout,
            window=c.window,
            attention_stride=c.attention_stride,
            global_tokens=c.global_tokens,
            random_blocks=c.random_blocks,
            scale=c.attention_scale,
            impl=c.attention_impl,
            norm_eps=c.norm_eps,
            dtype=c.dtype,
            name=name,
        )

    @staticmethod
    def init_cache(c: BlockConfig, batch: int, capacity: int) -> dict:
        """One layer's empty cache: the latent and RoPE key ``[B,1,S,R+Hr]``."""
        return init_latent_cache(batch, capacity, c.kv_rank, c.rope_dim, c.dtype)

    @staticmethod
    def cache_bytes(c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """Bytes of the latent caches of ``num_layers`` layers: ``B·L·S·(R+Hr)``."""
        size = np.dtype(c.dtype).itemsize
        return batch * num_layers * capacity * (c.kv_rank + c.rope_dim) * size

    def setup(self):
        N, H, R, Hr = self.num_heads, self.head_dim, self.kv_rank, self.rope_dim
        biased = self.attention_bias
        dense = lambda features, name, kernel, bias, axis=-1, use_bias=biased: (  # noqa: E731
            nn.DenseGeneral(
                features,
                axis=axis,
                use_bias=use_bias,
                dtype=self.dtype,
                name=name,
                **dense_inits(kernel, bias),
            )
        )
        heads = (HEADS, HEAD_WIDTH)
        self.kv_down = dense(R + Hr, "kv_down", (EMBED, None), (None,))
        self.kv_norm = RMSNorm(self.norm_eps, axis_name=None, name="kv_norm")
        self.key_up = self.param("key_up", named(_up_init(), None, *heads), (R, N, H - Hr))
        self.value_up = self.param("value_up", named(_up_init(), None, *heads), (R, N, H))
        if self.q_rank is None:
            self.query = dense((N, H), "query", (EMBED, *heads), heads)
        else:
            self.q_down = dense(self.q_rank, "q_down", (EMBED, None), (None,))
            self.q_norm = RMSNorm(self.norm_eps, axis_name=None, name="q_norm")
            self.q_up = dense((N, H), "q_up", (None, *heads), heads, use_bias=False)
        self.out = dense(self.d_model, "out", (*heads, EMBED), (EMBED,), axis=(-2, -1))

    def _queries(self, x, positions):
        """``(q_nope [B,T,N,H-Hr], q_rope [B,T,N,Hr])``, the RoPE part rotated."""
        q = self.query(x) if self.q_rank is None else self.q_up(self.q_norm(self.q_down(x)))
        split = self.head_dim - self.rope_dim
        q_nope, q_rope = q[..., :split], q[..., split:]
        if self.rope_dim:
            q_rope = apply_rope(q_rope, positions, self.rope_base, self.rope_layout)
        return q_nope, q_rope

    def latent(self, x, positions):
        """``[c ; k_rope] [B,T,R+Hr]``: what the cache keeps per token."""
        ckr = self.kv_down(x)
        c, k_rope = ckr[..., : self.kv_rank], ckr[..., self.kv_rank :]
        if self.rope_dim:
            k_rope = apply_rope(k_rope[:, :, None], positions, self.rope_base, self.rope_layout)
            k_rope = k_rope[:, :, 0]
        return jnp.concatenate([self.kv_norm(c).astype(k_rope.dtype), k_rope], -1)

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
        if context is not None or kv is not None:
            raise ValueError("latent attention is self-attention only (no context or kv)")
        kw = dict(
            causal=causal,
            alibi_slopes=alibi_slopes,
            bias=bias,
            **sparse_pattern(
                self.window, self.attention_stride, self.global_tokens, self.random_blocks
            ),
            scale=(1.0 / self.head_dim**0.5) if self.scale is None else self.scale,
            impl=self.impl,
        )
        q_nope, q_rope = self._queries(x, q_positions)
        latent = self.latent(x, q_positions)  # [B,T,R+Hr]
        R = self.kv_rank
        if cache is None:  # training: ordinary attention over N heads
            c, k_rope = latent[..., :R], latent[..., R:]
            k_nope = jnp.einsum("btr,rnh->btnh", c, self.key_up.astype(c.dtype))
            v = jnp.einsum("btr,rnh->btnh", c, self.value_up.astype(c.dtype))
            k_rope = jnp.broadcast_to(k_rope[:, :, None], (*k_nope.shape[:3], self.rope_dim))
            k = jnp.concatenate([k_nope, k_rope], -1)
            q = jnp.concatenate([q_nope, q_rope], -1)
            out = attention_fn(
                q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, **kw
            )
            return self.out(out), None
        # decoding: absorbed up-projections, multi-query attention over the latent cache
        q_offset = cache["index"]
        cache = write_cache(cache, {"k": latent[:, :, None]}, q_segment_ids)
        k = jnp.swapaxes(cache["k"], 1, 2)  # [B,S,1,R+Hr]
        q_latent = jnp.einsum("btnh,rnh->btnr", q_nope, self.key_up.astype(q_nope.dtype))
        q = jnp.concatenate([q_latent, q_rope], -1)
        out = attention_fn(
            q,
            k,
            k,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=cache["segment_ids"],
            q_offset=q_offset,
            **kw,
        )
        out = jnp.einsum("btnr,rnh->btnh", out[..., :R], self.value_up.astype(out.dtype))
        return self.out(out), cache
