"""Position-wise feed-forward networks: ReLU, GELU (Vaswani et al. 2017; exact, or the tanh
approximation of GPT-2 as ``gelu_tanh``), and the GLU variants SwiGLU, GEGLU (Shazeer 2020)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

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
    use_bias: bool = True
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, *, deterministic: bool = True):
        dense = lambda features, name: nn.Dense(
            features, use_bias=self.use_bias, dtype=self.dtype, name=name
        )
        if self.activation in GATED:
            h = GATED[self.activation](dense(self.d_ff, "gate")(x)) * dense(self.d_ff, "up")(x)
        elif self.activation in PLAIN:
            h = PLAIN[self.activation](dense(self.d_ff, "up")(x))
        else:
            raise ValueError(
                f"activation={self.activation!r} is not one of {', '.join([*PLAIN, *GATED])}"
            )
        h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
        return dense(x.shape[-1], "down")(h)
