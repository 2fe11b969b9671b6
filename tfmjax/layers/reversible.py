"""Reversible residual layers (Gomez et al. 2017, RevNet; Kitaev et al. 2020, Reformer).

The residual stream is two streams ``x1, x2 [B,T,D]``, both the embedding at the start. Each
layer is a pair of pre-norm sublayers::

    y1 = x1 + F(x2)        F = dropout(attention(LN1(.)))
    y2 = x2 + G(y1)        G = dropout(feed_forward(LN2(.)))

and its inputs follow from its outputs: ``x2 = y2 - G(y1)``, ``x1 = y1 - F(x2)``. So the
backward pass (:func:`reversible_layers`, a ``jax.custom_vjp``) keeps only the last layer's
``(y1, y2)`` and recomputes each layer's inputs, in reverse, while it differentiates it: the
activation memory of ``L`` layers is one layer's. The stack returns ``(y1 + y2) / 2`` (what
the output head's norm then reads). Dropout draws the same masks in the recomputation: each
sublayer gets its own key, passed explicitly. :func:`forward_layers` is the same math under
plain autodiff (activations stored), the twin the gradients are tested against.

:class:`ReversibleStack` replaces :class:`tfmjax.layers.stack.LayerStack` under
``model.reversible``: unrolled (``layer_0 .. layer_{L-1}``, each with the block's
``attention_norm``, ``attention``, ``mlp_norm``, ``mlp``), self-attention blocks only, dense
feed-forwards. Initialisation, cached decoding and traces with hooks on (interp) run the
same layers as bound modules, without the custom backward pass (none of them differentiates
through the stack for training); hook names are the block's: ``blocks.{l}.hook_attn_out``,
``hook_mlp_out``, ``attn.*``, ``ln1``, ``ln2``.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax

from tfmjax.layers.attention_variants import ATTENTION_VARIANTS
from tfmjax.layers.blocks import BlockInputs, _Block
from tfmjax.layers.dropout import Dropout
from tfmjax.layers.hooks import active, hook
from tfmjax.layers.norms import make_norm
from tfmjax.layers.stack import layer_cache


def forward_layers(f, g, params, x1, x2, floats, ints, keys):
    """The layers in order: ``(y1, y2)``. ``f(p, x, floats, ints, key)`` and ``g`` are the
    sublayers of layer params ``p``; ``keys``: ``2L`` dropout keys (F's, G's) or None."""
    for i, p in enumerate(params):
        kf, kg = (None, None) if keys is None else (keys[2 * i], keys[2 * i + 1])
        x1 = x1 + f(p, x2, floats, ints, kf)
        x2 = x2 + g(p, x1, floats, ints, kg)
    return x1, x2


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def reversible_layers(f, g, params, x1, x2, floats, ints, keys):
    """:func:`forward_layers` whose backward pass recomputes the activations (module
    docstring). Differentiable in ``params``, ``x1``, ``x2`` and ``floats`` (score biases);
    ``ints`` (positions, segment ids) and ``keys`` are not."""
    return forward_layers(f, g, params, x1, x2, floats, ints, keys)


def _fwd(f, g, params, x1, x2, floats, ints, keys):
    y = forward_layers(f, g, params, x1, x2, floats, ints, keys)
    return y, (params, *y, floats, ints, keys)


def _add(a, b):
    return jax.tree.map(lambda u, v: u + v, a, b)


def _bwd(f, g, residuals, cotangents):
    params, y1, y2, floats, ints, keys = residuals
    dy1, dy2 = cotangents
    dparams, dfloats = [None] * len(params), jax.tree.map(jax.numpy.zeros_like, floats)
    for i in reversed(range(len(params))):
        p = params[i]
        kf, kg = (None, None) if keys is None else (keys[2 * i], keys[2 * i + 1])
        gy, g_vjp = jax.vjp(lambda p, y, fl, kg=kg: g(p, y, fl, ints, kg), p, y1, floats)
        x2 = y2 - gy
        dp_g, dy1_g, dfl_g = g_vjp(dy2)
        dy1 = dy1 + dy1_g
        fx, f_vjp = jax.vjp(lambda p, x, fl, kf=kf: f(p, x, fl, ints, kf), p, x2, floats)
        x1 = y1 - fx
        dp_f, dx2_f, dfl_f = f_vjp(dy1)
        dy2 = dy2 + dx2_f
        dparams[i] = _add(dp_g, dp_f)
        dfloats = _add(dfloats, _add(dfl_g, dfl_f))
        y1, y2 = x1, x2
    return tuple(dparams), dy1, dy2, dfloats, None, None


reversible_layers.defvjp(_fwd, _bwd)


class ReversibleBlock(_Block):
    """One reversible pair: ``part="f"``: ``x2 -> (F(x2), cache)``; ``part="g"``: ``y1 ->
    (G(y1), None)`` (no residual sums: the stack adds them)."""

    causal: bool = False

    @nn.compact
    def __call__(self, x, inputs: BlockInputs, *, part: str, cache=None):
        c = self.cfg
        if part == "f":
            attn = ATTENTION_VARIANTS[c.attention].from_block_config(c, "attention")
            y, cache = attn(
                make_norm(c.norm, c.norm_eps, name="attention_norm")(x),
                q_positions=inputs.positions,
                q_segment_ids=inputs.segment_ids,
                kv_segment_ids=inputs.segment_ids,
                causal=self.causal,
                alibi_slopes=inputs.alibi_slopes,
                bias=inputs.bias,
                cache=cache,
            )
            y = hook(self, "hook_attn_out", y)
        else:
            h = hook(self, "hook_mlp_in", make_norm(c.norm, c.norm_eps, name="mlp_norm")(x))
            ff = self._feed_forward_module()
            y = hook(self, "hook_mlp_out", ff(h, deterministic=self.deterministic))
        return Dropout(c.dropout_rate)(y, deterministic=self.deterministic), cache


class ReversibleStack(nn.Module):
    """``x [B,T,D]``, per-layer ``cache`` (tuple, stacked or None) -> ``(x, cache)``: ``L``
    reversible pairs of :class:`ReversibleBlock` (module docstring). ``recompute=False``:
    plain autodiff through the same layers (the gradient twin)."""

    block_kwargs: dict  # of ReversibleBlock: cfg, deterministic, causal
    num_layers: int
    recompute: bool = True

    @nn.compact
    def __call__(self, x, cache, inputs: BlockInputs):
        kw = self.block_kwargs
        layers = [ReversibleBlock(**kw, name=f"layer_{i}") for i in range(self.num_layers)]
        if self.is_initializing() or cache is not None or active():
            return self._bound(layers, x, cache, inputs)
        params = tuple(self.variables["params"][f"layer_{i}"] for i in range(self.num_layers))
        unbound = ReversibleBlock(**kw, parent=None)

        def sublayer(part):
            def fn(p, x, floats, ints, key):
                extra = BlockInputs(ints[0], ints[1], floats[0], floats[1])
                rngs = {} if key is None else {"dropout": key}
                return unbound.apply({"params": p}, x, extra, part=part, rngs=rngs)[0]

            return fn

        keys = None
        if not kw.get("deterministic", True):
            keys = jax.random.split(self.make_rng("dropout"), 2 * self.num_layers)
        run = reversible_layers if self.recompute else forward_layers
        floats, ints = (inputs.alibi_slopes, inputs.bias), (inputs.positions, inputs.segment_ids)
        y1, y2 = run(sublayer("f"), sublayer("g"), params, x, x, floats, ints, keys)
        return (y1 + y2) / 2, None

    def _bound(self, layers, x, cache, inputs):
        """The same layers as bound modules (init, decoding, hooks): ``(x, cache)``."""
        x1 = x2 = x
        caches: list[Any] = []
        for i, layer in enumerate(layers):
            own = None if cache is None else layer_cache(cache, i)
            y, own = layer(x2, inputs, part="f", cache=own)
            x1 = x1 + y
            x2 = x2 + layer(x1, inputs, part="g")[0]
            caches.append(own)
        if cache is None:
            return (x1 + x2) / 2, None
        if isinstance(cache, tuple):
            return (x1 + x2) / 2, tuple(caches)
        return (x1 + x2) / 2, jax.tree.map(lambda *cs: jax.numpy.stack(cs), *caches)
