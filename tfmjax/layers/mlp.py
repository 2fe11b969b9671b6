"""Position-wise feed-forward networks: ReLU, GELU (Vaswani et al. 2017; exact, or the tanh
approximation of GPT-2 as ``gelu_tanh``), and the GLU variants SwiGLU, GEGLU (Shazeer 2020).

Hooks ``[B,T,F]``: ``hook_pre`` (before the activation; the gate of a GLU), ``hook_pre_linear``
(a GLU's linear half) and ``hook_post`` (the hidden layer the down projection reads).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.layers.axes import BATCH, EMBED, LENGTH, MLP, constrain, dense_inits
from tfmjax.layers.dropout import Dropout
from tfmjax.layers.folded_dot import folded_dot_general
from tfmjax.layers.hooks import hook

GATED = {
    "swiglu": jax.nn.silu,
    "geglu": lambda x: jax.nn.gelu(x, approximate=False),
    "geglu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # T5 v1.1's gated-gelu
}
PLAIN = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}


class FeedForward(nn.Module):
    """``W2 act(W1 x + b1) + b2``, or gated ``W2 (act(x Wg) * (x Wu))``. ``[B,T,D] -> [B,T,D]``."""

    d_ff: int
    activation: str = "relu"
    mlp_bias: bool = True  # of every dense layer
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, *, deterministic: bool = True):
        dense = (
            lambda features, name, axes: nn.Dense(  # noqa: E731
                features,
                use_bias=self.mlp_bias,
                dtype=self.dtype,
                name=name,
                dot_general=folded_dot_general,
                **dense_inits(axes, axes[1:]),
            )
        )
        if self.activation in GATED:
            gate = hook(self, "hook_pre", dense(self.d_ff, "gate", (EMBED, MLP))(x))
            linear = hook(self, "hook_pre_linear", dense(self.d_ff, "up", (EMBED, MLP))(x))
            h = GATED[self.activation](gate) * linear
        elif self.activation in PLAIN:
            up = dense(self.d_ff, "up", (EMBED, MLP))
            h = PLAIN[self.activation](hook(self, "hook_pre", up(x)))
        else:
            raise ValueError(
                f"activation={self.activation!r} is not one of {', '.join([*PLAIN, *GATED])}"
            )
        h = Dropout(self.dropout_rate)(hook(self, "hook_post", h), deterministic=deterministic)
        h = constrain(h, BATCH, LENGTH, MLP)
        return dense(x.shape[-1], "down", (MLP, EMBED))(h)
