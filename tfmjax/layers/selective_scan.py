"""A Mamba block (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Sec. 3.4 and Fig. 3) as a self-attention variant (``model.attention =
"selective_scan"``). It replaces the attention sublayer of a block (pre/post norm, residual
and feed-forward stay the block's), not the whole layer as in the paper's Mamba stack.

Letters: ``E = expand·D`` channels, ``P`` state size, ``W`` convolution width, ``R =
ceil(D/16)`` the rank of ``delta``'s projection (the paper's defaults: expand 2, P 16, W 4).

    [x, z] = in_proj(x)                    [B,T,D] -> [B,T,2,E]
    u      = silu(causal_conv(x))          depthwise, width W, over time
    delta  = softplus(dt_proj(u W_d))      [B,T,E]  (u W_d [B,T,R])
    Bm, Cm = u W_B, u W_C                  [B,T,P]  (input-dependent: "selective")
    y      = scan(u, delta, A, Bm, Cm) + D_skip * u,   A = -exp(A_log) [E,P]
    out    = out_proj(y * silu(z))         [B,T,E] -> [B,T,D]

Training uses the parallel scan (``jax.lax.associative_scan``,
:mod:`tfmjax.kernels.selective_scan`). Decoding carries ``{"h": [B,E,P] float32, "conv":
[B,W-1,E], "index": []}``: the scan state and the last ``W-1`` convolution inputs, a
constant size. Padding (segment id 0) enters neither: its convolution input is zeroed and
its ``delta`` is 0 (the state passes through unchanged). Packed rows are not separated.
Causal only. Initialisation as the paper's code: ``A_log = log(1..P)``, ``D_skip = 1``,
``dt_proj``'s bias the inverse softplus of steps log-uniform in ``[1e-3, 1e-1]``.

Hooks (:mod:`tfmjax.layers.hooks`), under the block's ``attn.`` (no heads: every hook has
the position on axis 1, and none a head axis):

- ``hook_conv_in [B,T,E]``: the convolution's input, ``x`` of ``in_proj`` (0 at padding);
- ``hook_ssm_input [B,T,E]``: ``u = silu(causal_conv(x))``, the scan's input;
- ``hook_delta [B,T,E]``: the step ``delta`` (after the softplus; 0 at padding, float32);
- ``hook_B``, ``hook_C [B,T,P]``: the input-dependent ``Bm`` and ``Cm``;
- ``hook_h [B,T,E,P]``: every state ``h_t`` (float32), formed only when asked for; ``y``
  is then read from it (``y_t = h_t . Cm_t``), so an edit reaches the output;
- ``hook_ssm_state [B,E,P]``: the state after the sequence (float32; no position axis);
  nothing in the forward pass reads it (a decoding step carries on from it: with a cache
  it is the new ``h``);
- ``hook_ssm_output [B,T,E]``: ``scan(...) + D_skip * u``, before the gate;
- ``hook_ssm_gate [B,T,E]``: ``silu(z)``, which multiplies it before ``out_proj``.

No queries, keys or heads: QK/OV circuits and head scores refuse it.
"""

from __future__ import annotations

import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels.selective_scan import (
    causal_conv,
    read_states,
    selective_scan,
    selective_scan_states,
)
from tfmjax.layers.axes import EMBED, MLP, dense_inits, named
from tfmjax.layers.block_config import BlockConfig
from tfmjax.layers.folded_dot import folded_dot_general
from tfmjax.layers.hooks import hook, wanted

DT_MIN, DT_MAX = 1e-3, 1e-1


def _dt_bias_init(key, shape, dtype=jnp.float32):
    """Inverse softplus of steps drawn log-uniform in ``[DT_MIN, DT_MAX]``."""
    u = jax.random.uniform(key, shape, jnp.float32)
    dt = jnp.exp(u * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)


def _a_log_init(key, shape, dtype=jnp.float32):
    """``log(1..P)`` for every channel (S4D-real)."""
    return jnp.broadcast_to(jnp.log(jnp.arange(1, shape[1] + 1, dtype=dtype)), shape)


class SelectiveScan(nn.Module):
    """``x [B,T,D]`` -> ``([B,T,D], cache)``: a Mamba mixer (causal)."""

    d_model: int
    state_size: int = 16
    expand: int = 2
    conv_width: int = 4
    dtype: jnp.dtype = jnp.float32
    qk_ov_circuits: ClassVar[bool] = False
    circuits_refused: ClassVar[str] = "it has no queries, keys or heads"
    causal_only: ClassVar[bool] = True  # no bidirectional form
    bidirectional_only: ClassVar[bool] = False

    @classmethod
    def from_block_config(cls, c: BlockConfig, name: str):
        return cls(c.d_model, c.ssm_state, c.ssm_expand, c.ssm_conv, dtype=c.dtype, name=name)

    @classmethod
    def init_cache(cls, c: BlockConfig, batch: int, capacity: int) -> dict:
        """One layer's empty ``h [B,E,P]`` (float32) and ``conv [B,W-1,E]`` (``dtype``)."""
        E = c.ssm_expand * c.d_model
        return {
            "h": jnp.zeros((batch, E, c.ssm_state), jnp.float32),
            "conv": jnp.zeros((batch, c.ssm_conv - 1, E), c.dtype),
            "index": jnp.zeros((), jnp.int32),
        }

    @classmethod
    def cache_bytes(cls, c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """``B·L·E·(4·P + (W-1)·itemsize)`` bytes (no ``S``)."""
        E, size = c.ssm_expand * c.d_model, np.dtype(c.dtype).itemsize
        return batch * num_layers * E * (4 * c.ssm_state + (c.ssm_conv - 1) * size)

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
            raise ValueError("selective_scan is a self-mixer without score biases")
        if not causal:
            raise ValueError("selective_scan is causal only: use it as a decoder's self-mixer")
        B, T, D = x.shape
        E, P, R = self.expand * D, self.state_size, math.ceil(D / 16)
        xz = self._dense((2, E), "in_proj", (EMBED, None, MLP), use_bias=False)(x)
        xs, z = xz[:, :, 0], xz[:, :, 1]
        keep = jnp.ones((B, T), bool) if q_segment_ids is None else q_segment_ids != 0
        xs = hook(self, "hook_conv_in", jnp.where(keep[..., None], xs, 0))
        u, conv_state = self._conv(xs, cache)
        u = hook(self, "hook_ssm_input", nn.silu(u))
        dt, bm, cm = jnp.split(
            self._dense(R + 2 * P, "x_proj", (MLP, None), use_bias=False)(u), [R, R + P], -1
        )
        bm, cm = hook(self, "hook_B", bm), hook(self, "hook_C", cm)
        dt_proj = nn.Dense(
            E,
            dtype=self.dtype,
            name="dt_proj",
            kernel_init=named(nn.linear.default_kernel_init, None, MLP),
            bias_init=named(_dt_bias_init, MLP),
        )
        delta = jnp.where(keep[..., None], jax.nn.softplus(dt_proj(dt).astype(jnp.float32)), 0.0)
        delta = hook(self, "hook_delta", delta)
        a_log = self.param("A_log", named(_a_log_init, MLP, None), (E, P))
        d_skip = self.param("D_skip", named(nn.initializers.ones, MLP), (E,))
        h0 = jnp.zeros((B, E, P), jnp.float32) if cache is None else cache["h"]
        y, h = self._scan(u, delta, -jnp.exp(a_log), bm, cm, h0)
        h = hook(self, "hook_ssm_state", h)
        y = hook(self, "hook_ssm_output", y + u * d_skip.astype(u.dtype)[None, None])
        y = y * hook(self, "hook_ssm_gate", nn.silu(z))
        out = self._dense(D, "out_proj", (MLP, EMBED), use_bias=False)(y)
        if cache is None:
            return out, None
        return out, {
            "h": h,
            "conv": conv_state.astype(cache["conv"].dtype),
            "index": cache["index"] + T,
        }

    def _dense(self, features, name: str, kernel: tuple, **kw) -> nn.Module:
        """A projection whose kernel's axes are named ``kernel`` (its bias's: the rest)."""
        return nn.DenseGeneral(
            features,
            dtype=self.dtype,
            dot_general=folded_dot_general,
            name=name,
            **dense_inits(kernel, kernel[1:]),
            **kw,
        )

    def _conv(self, xs, cache):
        """The causal depthwise convolution of ``xs [B,T,E]`` (after the cached inputs):
        ``(out [B,T,E], its new state [B,W-1,E])``."""
        B, _, E = xs.shape
        W = self.conv_width
        kernel = self.param("conv_kernel", named(nn.initializers.lecun_normal(), None, MLP), (W, E))
        conv_bias = self.param("conv_bias", named(nn.initializers.zeros, MLP), (E,))
        state = jnp.zeros((B, W - 1, E), xs.dtype) if cache is None else cache["conv"]
        return causal_conv(xs, kernel, conv_bias, state)

    def _scan(self, u, delta, a, bm, cm, h0):
        """``(y [B,T,E], h_T [B,E,P])``; every state ``h [B,T,E,P]`` is hooked (``hook_h``)
        only when wanted, and ``y`` is then read from it as hooked."""
        if not wanted(self, "hook_h"):
            return selective_scan(u, delta, a, bm, cm, h0)
        h = hook(self, "hook_h", selective_scan_states(u, delta, a, bm, h0))
        return read_states(h, cm).astype(u.dtype), h[:, -1]
