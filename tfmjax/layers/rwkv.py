"""RWKV-4 (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era", Sec. 4) as a
self-attention variant (``model.attention = "rwkv"``): the time-mix replaces the attention
sublayer of a block and brings its channel-mix, which replaces the feed-forward (the block's
norms, residuals and dropout stay; ``model.embed_norm`` is the paper's ``ln0``).

Token shift: ``shift(x)_t = x_{t-1}`` (0 before the first token) and ``lerp(mu) = mu * x +
(1 - mu) * shift(x)``, with a learned ``mu [D]`` per use.

Time-mix (eq. 11-17), per channel as in RWKV-4 (no heads: ``model.num_heads`` does not apply;
every hook is ``[B,T,D]``)::

    r, k, v = W_r lerp(mu_r), W_k lerp(mu_k), W_v lerp(mu_v)        [B,T,D]
    wkv     = WKV(w = exp(time_decay), u = time_first, k, v)        (tfmjax.kernels.rwkv)
    out     = W_o (sigmoid(r) * wkv)

Channel-mix (eq. 18-20), :class:`RWKVChannelMix`, ``F = model.d_ff`` hidden units::

    r = sigmoid(W_r lerp(mu_r)),   out = r * W_v relu(W_k lerp(mu_k))^2

Biases follow ``model.attention_bias`` (time-mix) and ``model.mlp_bias`` (channel-mix), but
``W_k`` of the time-mix never has one: adding a constant to every ``k_i`` scales the WKV's
numerator and denominator alike, so it would cancel (and get no gradient). The paper's model
has no biases (the preset ``tiny-rwkv`` sets ``use_bias = false``). Initialisation is
the official code's for the first layer, in every layer (a scanned stack shares one init):
``time_decay_i = -5 + 8 (i/(D-1))^0.7``, ``time_first_i = log 0.3 + 0.5 ((i+1) mod 3 - 1)``,
``mu_k = mu_v = i/D``, ``mu_r = (i/D)^0.5`` (channel-mix: ``mu_k = mu_r = i/D``).

Training runs the WKV's parallel form (an associative scan); decoding carries one layer's
``{"a", "b", "p": [B,D] float32, "shift", "ffn_shift": [B,D], "index": []}`` (the WKV state
and the last input of the time-mix and of the channel-mix) and runs the recurrence, never
growing with the length. Padding (segment id 0) is left out: its input is zeroed before the
shift (a left-padded row starts from 0, as an unpadded one) and the WKV state passes it
unchanged. Packed rows (segment ids > 1) are not separated. Causal only.

Hooks (:mod:`tfmjax.layers.hooks`), under the block's ``attn.``: ``hook_rwkv_r``,
``hook_rwkv_k``, ``hook_rwkv_v [B,T,D]`` (the projections, ``r`` before its sigmoid) and
``hook_wkv [B,T,D]`` (float32, what ``sigmoid(r)`` multiplies); under ``mlp.``: ``hook_pre``
(``W_k lerp(mu_k)``), ``hook_post`` (its squared ReLU, what ``W_v`` reads) and
``hook_receptance`` (``sigmoid(W_r lerp(mu_r))``), each ``[B,T,F]`` or ``[B,T,D]``. No
queries, keys or heads in the sense of attention: QK/OV circuits and head scores refuse it.
"""

from __future__ import annotations

import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels.rwkv import init_wkv_state, wkv_parallel, wkv_recurrent
from tfmjax.layers.axes import EMBED, MLP, dense_inits, named
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.dropout import Dropout
from tfmjax.layers.folded_dot import folded_dot_general
from tfmjax.layers.hooks import hook


def _ratio(shape, power: float):
    """``(i/D)^power`` for channel ``i`` (the official ``ddd ** ratio``)."""
    return jnp.power(jnp.arange(shape[0], dtype=jnp.float32) / shape[0], power)


def _mu_init(power: float):
    return lambda key, shape, dtype=jnp.float32: _ratio(shape, power).astype(dtype)


def _decay_init(key, shape, dtype=jnp.float32):
    """``-5 + 8 (i/(D-1))^0.7``: ``w = exp(time_decay)`` from ``e^-5`` to ``e^3``."""
    i = jnp.arange(shape[0], dtype=jnp.float32) / max(shape[0] - 1, 1)
    return (-5.0 + 8.0 * jnp.power(i, 0.7)).astype(dtype)


def _first_init(key, shape, dtype=jnp.float32):
    """``log 0.3`` plus the official zigzag ``0.5 ((i+1) mod 3 - 1)``."""
    zigzag = 0.5 * ((jnp.arange(shape[0]) + 1) % 3 - 1)
    return (math.log(0.3) + zigzag).astype(dtype)


def token_shift(x, prev, keep):
    """``(x [B,T,D] zeroed at padding, its shift [B,T,D])``: ``x_{t-1}``, ``prev [B,D]``
    (the last input of the previous call, or 0) before the first; ``keep [B,T]`` or None."""
    if keep is not None:
        x = jnp.where(keep[..., None], x, 0)
    return x, jnp.concatenate([prev[:, None].astype(x.dtype), x[:, :-1]], axis=1)


def lerp(module: nn.Module, name: str, init, x, shifted):
    """``mu * x + (1 - mu) * shifted`` with the learned ``mu [D]`` named ``name``."""
    mu = module.param(name, named(init, EMBED), (x.shape[-1],)).astype(x.dtype)
    return mu[None, None] * x + (1 - mu[None, None]) * shifted


def _dense(module: nn.Module, features: int, name: str, axes: tuple, bias: bool):
    return nn.Dense(
        features,
        use_bias=bias,
        dtype=module.dtype,
        dot_general=folded_dot_general,
        name=name,
        **dense_inits(axes, axes[1:]),
    )


class RWKVChannelMix(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], cache)``: RWKV's feed-forward (module docstring). It reads
    and writes ``cache["ffn_shift"]`` of the layer's cache (None: no decoding)."""

    d_ff: int
    mlp_bias: bool = False
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        return cls(c.d_ff, c.mlp_bias, c.dropout_rate, dtype=c.dtype, name=name)

    @nn.compact
    def __call__(self, x, segment_ids=None, cache=None, *, deterministic: bool = True):
        B, _, D = x.shape
        keep = None if segment_ids is None else segment_ids != 0
        prev = jnp.zeros((B, D), x.dtype) if cache is None else cache["ffn_shift"]
        x, shifted = token_shift(x, prev, keep)
        xk = lerp(self, "time_mix_k", _mu_init(1.0), x, shifted)
        xr = lerp(self, "time_mix_r", _mu_init(1.0), x, shifted)
        h = hook(self, "hook_pre", _dense(self, self.d_ff, "key", (EMBED, MLP), self.mlp_bias)(xk))
        h = hook(self, "hook_post", jnp.square(jax.nn.relu(h)))
        h = Dropout(self.dropout_rate)(h, deterministic=deterministic)
        r = _dense(self, D, "receptance", (EMBED, None), self.mlp_bias)(xr)
        r = hook(self, "hook_receptance", jax.nn.sigmoid(r))
        out = r * _dense(self, D, "value", (MLP, EMBED), self.mlp_bias)(h)
        if cache is None:
            return out, None
        return out, dict(cache, ffn_shift=x[:, -1].astype(cache["ffn_shift"].dtype))


class RWKVTimeMix(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], cache)``: RWKV-4's time-mix (causal); the block takes
    :attr:`feed_forward` as its feed-forward."""

    d_model: int
    attention_bias: bool = False
    dtype: jnp.dtype = jnp.float32
    qk_ov_circuits: ClassVar[bool] = False
    circuits_refused: ClassVar[str] = (
        "it has no heads and no attention scores (a per-channel decaying average)"
    )
    causal_only: ClassVar[bool] = True  # no bidirectional form
    bidirectional_only: ClassVar[bool] = False
    feed_forward: ClassVar[type] = RWKVChannelMix  # the block's feed-forward

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        return cls(c.d_model, c.attention_bias, dtype=c.dtype, name=name)

    @classmethod
    def init_cache(cls, c: BlockConfig, batch: int, capacity: int) -> dict:
        """One layer's empty WKV state (``a, b, p [B,D]`` float32), and the last inputs of
        the time-mix and the channel-mix (``shift``, ``ffn_shift [B,D]``, ``dtype``, zero);
        ``capacity`` does not matter."""
        zeros = jnp.zeros((batch, c.d_model), c.dtype)
        state = init_wkv_state(batch, c.d_model)
        return {**state, "shift": zeros, "ffn_shift": zeros, "index": jnp.zeros((), jnp.int32)}

    @classmethod
    def cache_bytes(cls, c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """``B·L·D·(3·4 + 2·itemsize)`` bytes (no ``S``)."""
        return batch * num_layers * c.d_model * (3 * 4 + 2 * np.dtype(c.dtype).itemsize)

    @nn.compact
    def __call__(
        self,
        x,
        context=None,
        *,
        q_positions=None,
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
            raise ValueError("rwkv is a self-mixer without score biases")
        if not causal:
            raise ValueError("rwkv is causal only: use it as a decoder's self-mixer")
        B, _, D = x.shape
        keep = None if q_segment_ids is None else q_segment_ids != 0
        prev = jnp.zeros((B, D), x.dtype) if cache is None else cache["shift"]
        x, shifted = token_shift(x, prev, keep)
        dense = lambda name, axes: _dense(self, D, name, axes, self.attention_bias)  # noqa: E731
        r = dense("receptance", (EMBED, MLP))(lerp(self, "time_mix_r", _mu_init(0.5), x, shifted))
        k = _dense(self, D, "key", (EMBED, MLP), False)  # a bias would cancel in the WKV ratio
        k = k(lerp(self, "time_mix_k", _mu_init(1.0), x, shifted))
        v = dense("value", (EMBED, MLP))(lerp(self, "time_mix_v", _mu_init(1.0), x, shifted))
        r, k, v = (hook(self, f"hook_rwkv_{n}", a) for n, a in (("r", r), ("k", k), ("v", v)))
        w = jnp.exp(self.param("time_decay", named(_decay_init, MLP), (D,)))
        u = self.param("time_first", named(_first_init, MLP), (D,))
        if cache is None:
            state = init_wkv_state(B, D)
            y, state = wkv_parallel(w, u, k, v, state, keep)
        else:
            state = {n: cache[n] for n in "abp"}
            y, state = wkv_recurrent(w, u, k, v, state, keep)
        y = hook(self, "hook_wkv", y)
        out = dense("output", (MLP, EMBED))(jax.nn.sigmoid(r) * y.astype(r.dtype))
        if cache is None:
            return out, None
        last = x[:, -1].astype(cache["shift"].dtype)
        return out, {**cache, **state, "shift": last, "index": cache["index"] + x.shape[1]}
