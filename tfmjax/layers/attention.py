"""Multi-head attention module for self- and cross-attention (MHA, GQA, MQA).

Projections: ``query [D,N,H]``, ``key``/``value [D,K,H]``, ``out [N,H,D]`` (K = N: MHA,
1 < K < N: GQA, K = 1: MQA; Vaswani 2017, Shazeer 2019, Ainslie 2023). The attention math is
:func:`tfmjax.kernels.attention`; this module adds projections, RoPE and the KV cache.

KV cache (self-attention decoding): a dict ``{"k": [B,K,S_max,H], "v": [B,K,S_max,H],
"segment_ids": [B,S_max] int32, "index": [] int32}``. New keys and values are written at
slot ``index``; queries attend causally with ``q_offset = index``. Keys and values are stored
head-major (``K`` before ``S``) so the attention matmuls read them in place: with ``S`` first,
XLA transposes every layer's whole cache at every decoding step (measured 1.7x slower per
step at batch 8 on CPU, bench/decode.py).

Hooks (:mod:`tfmjax.layers.hooks`, TransformerLens's names and meanings): ``hook_q [B,T,N,H]``,
``hook_k``/``hook_v [B,S,K,H]`` (the projections, before RoPE), ``hook_rot_q``/``hook_rot_k``
(after RoPE, in RoPE models only), ``hook_attn_scores [B,N,T,S]`` (the scaled logits plus
ALiBi or a bias, blocked entries -inf) and ``hook_pattern [B,N,T,S]`` (both formed from q and k
only when asked for, whatever the kernel), ``hook_z [B,T,N,H]`` (per-head outputs) and
``hook_result [B,T,N,D]`` (each head's share of the output, before the sum and the bias).

The input is ``x [B,T,D]``, or :class:`HeadInputs`: a separate, already normalised input per
head for the query, key and value (TransformerLens's split inputs, which the block builds
when one of its ``hook_attn_in``/``hook_q_input``/... hooks is edited).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels import attention as attention_fn
from tfmjax.kernels import reference
from tfmjax.kernels.masks import RandomBlocks
from tfmjax.layers.axes import (
    BATCH,
    EMBED,
    HEAD_WIDTH,
    HEADS,
    KV_HEADS,
    LENGTH,
    constrain,
    dense_inits,
)
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.folded_dot import folded_dot_general
from tfmjax.layers.hooks import edited, hook, wanted
from tfmjax.layers.positions import apply_rope


def init_cache(batch: int, max_len: int, num_kv_heads: int, head_dim: int, dtype=jnp.float32):
    """An empty self-attention KV cache for one layer."""
    return {
        "k": jnp.zeros((batch, num_kv_heads, max_len, head_dim), dtype),
        "v": jnp.zeros((batch, num_kv_heads, max_len, head_dim), dtype),
        "segment_ids": jnp.zeros((batch, max_len), jnp.int32),
        "index": jnp.zeros((), jnp.int32),
    }


def kv_cache_bytes(
    batch: int, num_layers: int, num_kv_heads: int, max_len: int, head_dim: int, dtype=jnp.float32
) -> int:
    """``2 · B · L · K · S · H · bytes_per_element``: keys and values of ``L`` layers."""
    return 2 * batch * num_layers * num_kv_heads * max_len * head_dim * np.dtype(dtype).itemsize


def write_cache(cache, arrays: dict, segment_ids):
    """Write ``arrays`` (``{"k": [B,T,K,H], ...}``, stored head-major ``[B,K,S,H]``) and
    ``segment_ids [B,T]`` at slot ``cache["index"]``; the index moves on by ``T``."""
    i, T = cache["index"], segment_ids.shape[1]
    out = dict(cache)
    for name, x in arrays.items():
        x = jnp.swapaxes(x, 1, 2).astype(cache[name].dtype)  # [B,K,T,H]
        out[name] = jax.lax.dynamic_update_slice(cache[name], x, (0, 0, i, 0))
    out["segment_ids"] = jax.lax.dynamic_update_slice(cache["segment_ids"], segment_ids, (0, i))
    out["index"] = i + T
    return out


def sparse_pattern(window, stride, global_tokens, random_blocks=None) -> dict:
    """The structured-mask arguments of :func:`tfmjax.kernels.attention` that are set."""
    out = {"window": window}
    if stride is not None:
        out["stride"] = stride
    if global_tokens:
        out["global_tokens"] = global_tokens
    if random_blocks is not None:
        out["random_blocks"] = random_blocks
    return out


def head_projections(d_model, num_heads, num_kv_heads, head_dim, use_bias, dtype):
    """``(query, key, value, out)`` modules, created in the caller's ``setup``:
    ``[B,T,D] -> [B,T,N,H]``, ``[B,S,D] -> [B,S,K,H]`` twice, and ``[B,T,N,H] -> [B,T,D]``,
    their kernels' and biases' axes named for sharding."""
    dense = lambda features, name, kernel, bias, axis=-1: nn.DenseGeneral(  # noqa: E731
        features,
        axis=axis,
        use_bias=use_bias,
        dtype=dtype,
        name=name,
        dot_general=folded_dot_general,
        **dense_inits(kernel, bias),
    )
    heads, kv_heads = (HEADS, HEAD_WIDTH), (KV_HEADS, HEAD_WIDTH)
    return (
        dense((num_heads, head_dim), "query", (EMBED, *heads), heads),
        dense((num_kv_heads, head_dim), "key", (EMBED, *kv_heads), kv_heads),
        dense((num_kv_heads, head_dim), "value", (EMBED, *kv_heads), kv_heads),
        dense(d_model, "out", (*heads, EMBED), (EMBED,), axis=(-2, -1)),
    )


class HeadInputs(NamedTuple):
    """One input row per head: ``q [B,T,N,D]``, ``k``/``v [B,S,K,D]``."""

    q: jax.Array
    k: jax.Array
    v: jax.Array


class MultiHeadAttention(nn.Module):
    """``x [B,T,D]`` (and ``context [B,S,D]`` for cross-attention) -> ``[B,T,D]``."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_bias: bool = True  # of the projections
    rope_base: float | None = None  # None: no RoPE
    rope_layout: str = "interleaved"  # or "half_split" (see apply_rope)
    window: int | None = None
    attention_stride: int | None = None  # Sparse Transformer's pattern (tfmjax.kernels.masks)
    global_tokens: int = 0  # Longformer's global tokens: the first positions see and are seen
    random_blocks: RandomBlocks | None = None  # BigBird's random key blocks
    scale: float | None = None  # of the attention logits; None: 1/sqrt(head_dim)
    impl: str = "auto"
    dtype: jnp.dtype = jnp.float32
    # Separate query, key, value and out kernels per head: the QK/OV circuits of interp.
    qk_ov_circuits: ClassVar[bool] = True
    split_inputs: ClassVar[bool] = True  # takes HeadInputs (TransformerLens's split inputs)
    causal_only: ClassVar[bool] = False  # also bidirectional (encoders)
    bidirectional_only: ClassVar[bool] = False  # also causal (decoders)

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str, *, cross: bool = False):
        """The block's softmax attention; ``cross``: no RoPE and no sparse pattern (encoder
        slots are not decoder positions)."""
        return cls(
            c.d_model,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            attention_bias=c.attention_bias,
            rope_base=None if cross else c.rope_base,
            rope_layout=c.rope_layout,
            window=None if cross else c.window,
            attention_stride=None if cross else c.attention_stride,
            global_tokens=0 if cross else c.global_tokens,
            random_blocks=None if cross else c.random_blocks,
            scale=c.attention_scale,
            impl=c.attention_impl,
            dtype=c.dtype,
            name=name,
        )

    @staticmethod
    def init_cache(c: BlockConfig, batch: int, capacity: int) -> dict:
        """One layer's empty KV cache (see the module docstring)."""
        return init_cache(batch, capacity, c.num_kv_heads, c.head_dim, c.dtype)

    @staticmethod
    def cache_bytes(c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """Bytes of the keys and values of ``num_layers`` layers: ``2·B·L·K·S·H``."""
        return kv_cache_bytes(batch, num_layers, c.num_kv_heads, capacity, c.head_dim, c.dtype)

    def setup(self):
        sizes = (self.d_model, self.num_heads, self.num_kv_heads, self.head_dim)
        self.query, self.key, self.value, self.out = head_projections(
            *sizes, self.attention_bias, self.dtype
        )

    def project_kv(self, context):
        """Keys and values ``[B,S,K,H]`` of ``context [B,S,D]`` (no RoPE)."""
        return self.key(context), self.value(context)

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
        """Returns ``(out [B,T,D], cache)``.

        ``q_positions [B,T]``/``kv_positions [B,S]``: absolute positions for RoPE.
        ``kv``: precomputed cross-attention ``(k, v)`` (from :meth:`project_kv`).
        ``cache``: self-attention KV cache (see module docstring), returned updated.
        """
        if isinstance(x, HeadInputs):
            q, k, v = self._project_heads(x)
        else:
            q = self.query(x)
            k, v = self.project_kv(x if context is None else context) if kv is None else kv
        q = constrain(q, BATCH, LENGTH, HEADS, HEAD_WIDTH)
        k, v = (constrain(a, BATCH, LENGTH, KV_HEADS, HEAD_WIDTH) for a in (k, v))
        q, k, v = (hook(self, f"hook_{n}", a) for n, a in (("q", q), ("k", k), ("v", v)))
        if self.rope_base is not None:
            k_positions = q_positions if kv_positions is None else kv_positions
            rope = lambda a, positions: apply_rope(a, positions, self.rope_base, self.rope_layout)
            q = hook(self, "hook_rot_q", rope(q, q_positions))
            k = hook(self, "hook_rot_k", rope(k, k_positions))
        q_offset = 0
        if cache is not None:
            q_offset = cache["index"]
            cache = write_cache(cache, {"k": k, "v": v}, q_segment_ids)
            k, v = jnp.swapaxes(cache["k"], 1, 2), jnp.swapaxes(cache["v"], 1, 2)  # [B,S,K,H]
            kv_segment_ids = cache["segment_ids"]
        kw = dict(
            causal=causal,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
            **sparse_pattern(
                self.window, self.attention_stride, self.global_tokens, self.random_blocks
            ),
            alibi_slopes=alibi_slopes,
            bias=bias,
            q_offset=q_offset,
            scale=self.scale,
        )
        if wanted(self, "hook_pattern") or wanted(self, "hook_attn_scores"):
            out = self._through_pattern(q, k, v, kw)
        else:
            out = attention_fn(q, k, v, **kw, impl=self.impl)
        out = hook(self, "hook_z", out)
        if wanted(self, "hook_result"):
            return through_result(self, out), cache
        return self.out(out), cache

    def _project_heads(self, inputs: HeadInputs):
        """``q [B,T,N,H]``, ``k, v [B,S,K,H]``: each head's projection of its own input row."""
        params = self.variables["params"]
        out = []
        for name, x in zip(("query", "key", "value"), inputs, strict=True):
            kernel = params[name]["kernel"].astype(self.dtype)  # [D,N|K,H]
            y = jnp.einsum("BTND,DNH->BTNH", x.astype(self.dtype), kernel)
            if self.attention_bias:
                y = y + params[name]["bias"].astype(y.dtype)[None, None]
            out.append(y)
        return tuple(out)

    def _through_pattern(self, q, k, v, kw):
        """Attention with its scores and pattern ``[B,N,T,S]`` formed (hooks
        ``hook_attn_scores``, ``hook_pattern``). The output is the kernel's unless one of them
        is edited: then it is ``pattern · v``."""
        scale = self.head_dim**-0.5 if self.scale is None else self.scale
        scores = hook(self, "hook_attn_scores", reference.scores(q, k, **dict(kw, scale=scale)))
        pattern = hook(self, "hook_pattern", reference.softmax_rows(scores))
        if edited(self, "hook_pattern") or edited(self, "hook_attn_scores"):
            return reference.weighted_values(pattern, v).astype(q.dtype)
        return attention_fn(q, k, v, **kw, impl=self.impl)


def through_result(module: nn.Module, z):
    """``module.out(z)`` (``z [B,T,N,H]``, ``out`` from :func:`head_projections`) with each
    head's share ``[B,T,N,D]`` formed (hook ``hook_result``); it is ``module.out(z)`` unless
    the result is edited: then the heads' sum plus the bias (``module.attention_bias``)."""
    out = module.variables["params"]["out"]
    result = jnp.einsum("BTNH,NHD->BTND", z, out["kernel"].astype(z.dtype))
    result = hook(module, "hook_result", result)
    if not edited(module, "hook_result"):
        return module.out(z)
    y = jnp.sum(result, axis=2)
    return y + out["bias"].astype(y.dtype).reshape(1, 1, -1) if module.attention_bias else y
