"""Mixture-of-experts feed-forward: a learned router sends each token to ``top_k`` of ``E``
feed-forward experts (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et
al. 2021; Mixtral, Jiang et al. 2024).

Each sequence is a group (GShard's groups): expert ``e`` has ``ceil(capacity_factor * n *
top_k / E)`` slots in a sequence of ``n`` tokens (padding not counted, so padding changes
nothing), or ``n`` when ``capacity_factor = 0`` (dropless: a token never chooses one expert
twice); ``C``, the slots held in the tensors, is that of ``T``. A forward without dropout
(``deterministic``: evaluation, decoding, interp) takes ``eval_capacity_factor`` instead when
it is set (t5x's evaluation capacity factor; the model's default is dropless there, so that a
teacher-forced evaluation sees what one-token-at-a-time decoding sees). Slots are taken in
token order (a token's first choice, then its second, then the next token's), so in a causal
decoder whether a token is dropped depends on the tokens before it only (GShard's priority,
all first choices before any second choice, would let a later token push out an earlier
one's second choice). A choice past its expert's last slot is dropped: the token gets
nothing from that expert, and a token dropped by all of its choices passes through the
residual alone. Padding tokens (``token_mask`` 0) take no slot and count in no loss.
Dispatch and combine are one-hot tensors ``[B,T,E,C]`` (``E`` experts, ``C`` slots); the
experts' weights are stacked ``[E, ...]`` and split over the mesh axis ``expert``.

Gates: the router's softmax probability of each chosen expert (Switch), or, when
``renormalize``, those probabilities divided by their sum over the chosen experts
(GShard/Mixtral top-2).

Sown into the collection :data:`COLLECTION` (read with ``mutable=[COLLECTION]``), one scalar
per MoE layer, over the non-padding tokens of the call:

- ``aux_loss``: Switch's load-balancing loss ``E * sum_e f_e * P_e``, ``f_e`` the fraction of
  the ``T * top_k`` choices that went to expert ``e`` (before capacity), ``P_e`` the mean
  router probability of ``e``; 1 when perfectly balanced.
- ``z_loss``: ST-MoE's router z-loss (Zoph et al. 2022), the mean of
  ``logsumexp(router logits)^2``.
- ``dropped``: the fraction of the choices dropped for want of capacity.

Hooks: ``hook_router_logits [B,T,E]`` (float32), ``hook_expert_indices [B,T,top_k]`` (int32;
an edit re-routes: the gates are read from the router's probabilities at the edited
choices), ``hook_expert_weights [B,T,top_k]`` (the gates).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfmjax.layers.axes import BATCH, EMBED, EXPERT, LENGTH, MLP, constrain, named
from tfmjax.layers.dropout import Dropout
from tfmjax.layers.hooks import hook
from tfmjax.layers.mlp import GATED, PLAIN

COLLECTION = "moe"
# Switch's router initialisation (Fedus et al. 2021, section 2.4): a tenth of the usual
# fan-in variance, so the router starts near uniform and training is stable.
ROUTER_INIT = nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal")
METRICS = ("aux_loss", "z_loss", "dropped")  # what each MoE layer sows


def capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert for a group of ``tokens``: ``ceil(factor * tokens * top_k / E)``
    (at least 1, at most ``tokens``); ``tokens`` when ``capacity_factor`` is 0 (dropless)."""
    if capacity_factor == 0:
        return tokens
    slots = math.ceil(capacity_factor * tokens * top_k / num_experts)
    return max(1, min(tokens, slots))


def route(choices, gates, token_mask, num_experts: int, capacity_factor: float):
    """Dispatch and combine tensors of the router's choices, with capacity.

    ``choices, gates [B,T,k]`` (expert ids, weights), ``token_mask [B,T]`` (1 = a token) ->
    ``(dispatch [B,T,E,C], combine [B,T,E,C], chosen [B,T,k,E], kept [B,T,k,E])``: ``dispatch``
    is 1 where a token fills a slot, ``combine`` the gate there; ``chosen`` marks each choice of
    a real token, ``kept`` those that found a slot. Row ``b`` has :func:`capacity` of its own
    token count slots per expert (padding changes no row's capacity); ``C`` is that of ``T``."""
    B, T, k = choices.shape
    mask = token_mask.astype(jnp.float32)
    chosen = jax.nn.one_hot(choices, num_experts, dtype=jnp.float32) * mask[:, :, None, None]
    # Slot of each choice in its expert: in token order (a token's first choice before its
    # second), so whether a token is dropped depends on the tokens before it only (causal).
    slot = jnp.cumsum(chosen.reshape(B, T * k, num_experts), axis=1) - 1.0
    slot = slot.reshape(B, T, k, num_experts)
    by_count = jnp.asarray([capacity(n, num_experts, k, capacity_factor) for n in range(T + 1)])
    row_slots = by_count[jnp.sum(mask, axis=1).astype(jnp.int32)]  # [B]
    kept = chosen * (slot < row_slots[:, None, None, None]).astype(jnp.float32)
    slots = capacity(T, num_experts, k, capacity_factor)
    slot_of_choice = jnp.sum(slot * kept, axis=-1).astype(jnp.int32)  # [B,T,k]
    slot_hot = jax.nn.one_hot(slot_of_choice, slots, dtype=jnp.float32)  # [B,T,k,C]
    dispatch = jnp.sum(kept[..., None] * slot_hot[:, :, :, None, :], axis=2)
    weighted = (kept * gates[..., None])[..., None] * slot_hot[:, :, :, None, :]
    combine = jnp.sum(weighted, axis=2)
    return dispatch, combine, chosen, kept


def router_losses(logits, probs, chosen, kept, token_mask) -> dict:
    """The scalars of :data:`METRICS` from the router's ``logits, probs [B,T,E]`` and the
    ``chosen, kept [B,T,k,E]`` of :func:`route`, over the tokens of ``token_mask [B,T]``."""
    mask = token_mask.astype(jnp.float32)
    tokens = jnp.maximum(jnp.sum(mask), 1.0)
    E, k = probs.shape[-1], chosen.shape[2]
    fraction = jnp.sum(chosen, axis=(0, 1, 2)) / (tokens * k)  # f_e [E]
    mean_prob = jnp.sum(probs * mask[..., None], axis=(0, 1)) / tokens  # P_e [E]
    z = jax.nn.logsumexp(logits, axis=-1)
    return {
        "aux_loss": E * jnp.sum(fraction * mean_prob),
        "z_loss": jnp.sum(z * z * mask) / tokens,
        "dropped": (jnp.sum(chosen) - jnp.sum(kept)) / jnp.maximum(jnp.sum(chosen), 1.0),
    }


def _expert_init(*names: str):
    """Flax's Dense kernel init per expert (fan-in over the second-to-last axis)."""
    init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    return named(init, *names)


class MoEFeedForward(nn.Module):
    """Router, top-k choice with capacity, ``E`` experts of :mod:`tfmjax.layers.mlp`'s kinds
    (ReLU, GELU, SwiGLU, ...), combine. ``[B,T,D] -> [B,T,D]``; see the module docstring."""

    num_experts: int
    top_k: int
    d_ff: int
    activation: str = "relu"
    capacity_factor: float = 1.25
    eval_capacity_factor: float | None = None  # when deterministic; None: capacity_factor
    renormalize: bool = False
    mlp_bias: bool = True
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, token_mask=None, *, deterministic: bool = True):
        B, T, D = x.shape
        E, k = self.num_experts, self.top_k
        mask = jnp.ones((B, T), jnp.float32) if token_mask is None else token_mask
        router = nn.Dense(
            E,
            use_bias=False,
            dtype=jnp.float32,
            kernel_init=named(ROUTER_INIT, EMBED, None),
            name="router",
        )
        logits = hook(self, "hook_router_logits", router(x.astype(jnp.float32)))  # [B,T,E]
        probs = jax.nn.softmax(logits, axis=-1)
        choices = hook(self, "hook_expert_indices", jax.lax.top_k(probs, k)[1].astype(jnp.int32))
        gates = jnp.take_along_axis(probs, choices, axis=-1)  # [B,T,k]
        if self.renormalize:
            gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        gates = hook(self, "hook_expert_weights", gates)
        factor = self.capacity_factor
        if deterministic and self.eval_capacity_factor is not None:
            factor = self.eval_capacity_factor
        dispatch, combine, chosen, kept = route(choices, gates, mask, E, factor)
        for name, value in router_losses(logits, probs, chosen, kept, mask).items():
            self.sow(COLLECTION, name, value)
        xe = jnp.einsum("BTEC,BTD->EBCD", dispatch.astype(self.dtype), x.astype(self.dtype))
        xe = constrain(xe, EXPERT, BATCH, None, EMBED)
        ye = self._experts(xe, deterministic)
        y = jnp.einsum("BTEC,EBCD->BTD", combine.astype(self.dtype), ye)
        return constrain(y, BATCH, LENGTH, EMBED)

    def _experts(self, xe, deterministic: bool):
        """The ``E`` feed-forwards on their slots: ``[E,B,C,D] -> [E,B,C,D]``."""
        E, D, F = self.num_experts, xe.shape[-1], self.d_ff

        def dense(name, x, shape, kernel_axes, pattern):
            w = self.param(name, _expert_init(EXPERT, *kernel_axes), (E, *shape))
            y = jnp.einsum(pattern, x, w.astype(self.dtype))
            if self.mlp_bias:
                b = self.param(
                    f"{name}_bias",
                    named(nn.initializers.zeros, EXPERT, kernel_axes[1]),
                    (E, shape[1]),
                )
                y = y + b.astype(self.dtype)[:, None, None, :]
            return y

        up = "EBCD,EDF->EBCF"
        if self.activation in GATED:
            gate = dense("gate", xe, (D, F), (EMBED, MLP), up)
            h = GATED[self.activation](gate) * dense("up", xe, (D, F), (EMBED, MLP), up)
        elif self.activation in PLAIN:
            h = PLAIN[self.activation](dense("up", xe, (D, F), (EMBED, MLP), up))
        else:
            raise ValueError(
                f"activation={self.activation!r} is not one of {', '.join([*PLAIN, *GATED])}"
            )
        h = Dropout(self.dropout_rate)(h, deterministic=deterministic)
        h = constrain(h, EXPERT, BATCH, None, MLP)
        return dense("down", h, (F, D), (MLP, EMBED), "EBCF,EFD->EBCD")
