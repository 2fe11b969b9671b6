"""TransformerLens's cache helpers, with its meanings, as methods of the activation cache.

:class:`tfmjax.interp.ActivationCache` inherits :class:`TransformerLensHelpers`: a notebook
written for TransformerLens (Nanda and Bloom 2022) ports line by line:

    cache["pattern", 0]                   # blocks.0.attn.hook_pattern   [B,N,T,S]
    cache.accumulated_resid(apply_ln=True, pos_slice=-1)         # [C,B,D] (logit lens)
    cache.decompose_resid(return_labels=True)                    # embed, pos_embed, 0_attn_out, ...
    cache.stack_head_results(incl_remainder=True)                # L0H0, ..., remainder
    cache.apply_ln_to_stack(stack, layer)                        # centred, / the cached scale
    cache.logit_attrs(stack, tokens, incorrect_tokens)           # [C, ...]

Arrays are ``[C, B, T, D]`` stacks of residual-stream components (C components); ``pos_slice``
selects positions as TransformerLens's ``Slice`` does (an int drops the axis; a ``(start,
stop[, step])`` tuple, a ``slice`` or a list of indices keeps it). The helpers read the stack
the output head reads (``model.head_stack``: the decoder of both decoder families); in an
encoder-decoder decoder the cross-attention outputs join the attention's (``0_cross_attn_out``,
``0_mid_cross``), and ``stack_head_results`` stacks the self-attention heads.

As in TransformerLens, ``apply_ln_to_stack`` centres (LayerNorm) and divides by the cached
``hook_scale``; it does not multiply by the norm's weight nor add its bias: it assumes them
folded into the next weights (:func:`tfmjax.interp.folding.fold_final_norm` does so for the
final norm). ``logit_attrs`` therefore equals :func:`tfmjax.interp.logit_attribution` on a
folded model, and on an unfolded one it gives TransformerLens's numbers for unfolded weights.
``accumulated_resid(apply_ln=True)`` at the last layer applies the final norm itself, weight
and bias included, to each component (the logit lens), as TransformerLens 4 does.

The helpers need the model (and ``logit_attrs`` its params): ``run_with_cache`` binds them;
a cache rebuilt from its leaves (through ``jax.jit``) is bound again with ``cache.bind``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.interp.circuits import embedding_matrices

# The positions the embedding adds as a table (hook_pos_embed): the others act in attention.
ABSOLUTE_POSITIONS = ("learned", "sinusoidal", "abacus")


def take(x, pos_slice, axis: int):
    """``x`` with TransformerLens's ``Slice`` applied on ``axis`` (None: all of it)."""
    if pos_slice is None:
        return x
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    index = [slice(None)] * x.ndim
    index[axis] = pos_slice if isinstance(pos_slice, int | slice) else jnp.asarray(pos_slice)
    return x[tuple(index)]


def lead(x, ndim: int):
    """``x`` with leading axes of size 1 up to ``ndim`` axes (explicit broadcasting)."""
    return jnp.reshape(x, (1,) * (ndim - jnp.ndim(x)) + jnp.shape(x))


class TransformerLensHelpers:
    """TransformerLens's ``ActivationCache`` methods (module docstring); mixed into the cache,
    which provides ``__getitem__``, ``activations``, ``model`` and ``params``."""

    # -- what the helpers read -------------------------------------------------------

    def _bound_model(self):
        if self.model is None:
            raise ValueError(
                "this cache is not bound to its model (a cache rebuilt by jax.jit loses it): "
                "call cache.bind(model, params) first"
            )
        return self.model

    def _stack(self) -> str:
        """The stack the helpers read (the head's), of a pre-norm model."""
        model = self._bound_model()
        if model.config.norm_position != "pre":
            raise ValueError(
                "TransformerLens's cache helpers need a pre-norm model (model.norm_position="
                "'pre'): a post-norm block renormalises the residual stream, so its parts do "
                "not add up and its norms read the sum after each sublayer"
            )
        return model.head_stack

    def _layers(self) -> int:
        model = self._bound_model()
        return model.layer_stacks()[model.head_stack]

    def _at(self, name: str, layer: int | None = None):
        """The head stack's activation ``name`` (of block ``layer``); a KeyError if the cache
        does not hold it."""
        block = "" if layer is None else f"blocks.{layer}."
        return self[f"{self._stack()}.{block}{name}"]

    def _crosses(self) -> bool:
        """Whether the stack's blocks have cross-attention (an encoder-decoder's decoder)."""
        return self._stack() == "decoder" and "encoder" in self._bound_model().layer_stacks()

    def _last_layer(self, layer) -> int:
        return self._layers() if layer is None or layer == -1 else layer

    # -- stacks of components ----------------------------------------------------------

    def accumulated_resid(
        self,
        layer=None,
        incl_mid=False,
        apply_ln=False,
        pos_slice=None,
        mlp_input=False,
        return_labels=False,
    ):
        """The residual stream before each layer up to ``layer`` (default: all, then the
        last layer's output, ``final_post``): ``[C, B, T, D]`` and the labels ``0_pre``,
        ``0_mid`` (``incl_mid``), ..."""
        L, layer = self._layers(), self._last_layer(layer)
        parts, labels = [], []
        for l in range(layer + 1):
            if l == L:
                parts.append(self._at("hook_resid_post", L - 1))
                labels.append("final_post")
                continue
            parts.append(self._at("hook_resid_pre", l))
            labels.append(f"{l}_pre")
            if (incl_mid and l < layer) or (mlp_input and l == layer):
                mids = ["mid", "mid_cross"] if self._crosses() else ["mid"]
                parts.extend(self._at(f"hook_resid_{mid}", l) for mid in mids)
                labels.extend(f"{l}_{mid}" for mid in mids)
        stack = jnp.stack([take(p, pos_slice, -2) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(
                stack, layer, mlp_input, pos_slice=pos_slice, recompute_ln=layer == L
            )
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer=None,
        mlp_input=False,
        mode="all",
        apply_ln=False,
        pos_slice=None,
        incl_embeds=True,
        return_labels=False,
    ):
        """The residual stream at ``layer`` as the sum of what wrote it: ``embed``,
        ``pos_embed``, then ``{l}_attn_out`` and ``{l}_mlp_out`` (``mode``: ``"all"``,
        ``"attn"``, ``"mlp"``); ``[C, B, T, D]``."""
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode={mode!r} is not one of all, attn, mlp")
        layer = self._last_layer(layer)
        attention = ["attn", "cross_attn"] if self._crosses() else ["attn"]
        sublayers = (attention if mode != "mlp" else []) + (["mlp"] if mode != "attn" else [])
        parts, labels = self._embeddings() if incl_embeds else ([], [])
        for l in range(layer + int(mlp_input)):
            for sub in sublayers:
                if l == layer and sub == "mlp":  # mlp_input: the attention of `layer` only
                    continue
                parts.append(self._at(f"hook_{sub}_out", l))
                labels.append(f"{l}_{sub}_out")
        stack = jnp.stack([take(p, pos_slice, -2) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def _embeddings(self):
        """``([arrays], [labels])`` of the embedding's parts of the residual stream."""
        cfg = self._bound_model().config
        if cfg.embed_norm or cfg.type_vocab_size:  # not a sum of its tables
            return [self._at("hook_resid_pre", 0)], ["embed"]
        parts, labels = [self._at("hook_embed")], ["embed"]
        if cfg.position in ABSOLUTE_POSITIONS:
            parts.append(self._at("hook_pos_embed"))
            labels.append("pos_embed")
        return parts, labels

    def stack_head_results(
        self, layer=-1, return_labels=False, incl_remainder=False, pos_slice=None, apply_ln=False
    ):
        """Each attention head's output ``hook_result`` of the layers before ``layer``
        (default all), labelled ``L{l}H{n}``, and with ``incl_remainder`` the rest of the
        residual stream (``remainder``): ``[C, B, T, D]``."""
        layer = self._last_layer(layer)
        heads, labels = [], []
        for l in range(layer):
            result = take(self._at("attn.hook_result", l), pos_slice, -3)  # [B,T,N,D]
            heads.extend(jnp.moveaxis(result, -2, 0))
            labels.extend(f"L{l}H{n}" for n in range(result.shape[-2]))
        if incl_remainder:
            residual = take(self._at("hook_resid_post", layer - 1), pos_slice, -2)
            heads.append(residual - sum(heads) if heads else residual)
            labels.append("remainder")
        if heads:
            stack = jnp.stack(heads)
        else:
            empty = take(self._at("hook_embed"), pos_slice, -2)
            stack = jnp.zeros((0, *empty.shape), empty.dtype)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    # -- through the norm and the unembedding ------------------------------------------

    def apply_ln_to_stack(
        self,
        residual_stack,
        layer=None,
        mlp_input=False,
        pos_slice=None,
        batch_slice=None,
        has_batch_dim=True,
        recompute_ln=False,
    ):
        """``residual_stack [C, B, T, D]`` through the norm that reads the residual stream
        at ``layer`` (``ln1``, ``ln2`` with ``mlp_input``, the final norm at the last layer),
        its scale frozen from the cache: centred (LayerNorm), divided by ``hook_scale``."""
        self._stack()  # a pre-norm model
        cfg, L, layer = self._bound_model().config, self._layers(), self._last_layer(layer)
        stack = jnp.asarray(residual_stack, jnp.float32)
        if has_batch_dim:
            stack = take(stack, batch_slice, 1)
        if recompute_ln and layer == L:
            return self._final_norm(stack)
        if cfg.norm == "layernorm":
            stack = stack - jnp.mean(stack, axis=-1, keepdims=True)
        name = "ln_final.hook_scale" if layer == L else f"ln{2 if mlp_input else 1}.hook_scale"
        scale = take(self._at(name, None if layer == L else layer), pos_slice, -2)
        if has_batch_dim:
            scale = take(scale, batch_slice, 0)
        return stack / lead(scale, stack.ndim)

    def _final_norm(self, stack):
        """The final norm applied to each component on its own: weight and bias included."""
        cfg = self._bound_model().config
        norm = self._head_params()["final_norm"]
        if cfg.norm == "layernorm":
            stack = stack - jnp.mean(stack, axis=-1, keepdims=True)
        stack = stack / jnp.sqrt(jnp.mean(jnp.square(stack), axis=-1, keepdims=True) + cfg.norm_eps)
        stack = stack * lead(norm["scale"].astype(jnp.float32), stack.ndim)
        return (
            stack + lead(norm["bias"].astype(jnp.float32), stack.ndim) if "bias" in norm else stack
        )

    def _head_params(self) -> dict:
        if self.params is None:
            raise ValueError("this cache is not bound to params: call cache.bind(model, params)")
        return self.params["params"]["head"]

    def tokens_to_residual_directions(self, tokens):
        """The unembedding's columns ``W_U[:, tokens]`` as ``tokens.shape + (D,)``."""
        model = self._bound_model()
        if model.config.mlm_head:
            raise ValueError(
                "logit directions need a linear head; model.mlm_head transforms the residual "
                "stream before the unembedding"
            )
        self._head_params()
        _, W_U = embedding_matrices(model, self.params)  # [D,V]
        V = W_U.shape[1]
        if not isinstance(tokens, jax.core.Tracer):  # JAX would clamp an id out of range
            ids = np.asarray(tokens)
            if ids.size and (ids.min() < 0 or ids.max() >= V):
                raise ValueError(
                    f"token id {int(ids.max() if ids.max() >= V else ids.min())} is outside "
                    f"the vocabulary (ids 0..{V - 1})"
                )
        return jnp.moveaxis(W_U.astype(jnp.float32)[:, jnp.asarray(tokens)], 0, -1)

    def logit_attrs(
        self,
        residual_stack,
        tokens,
        incorrect_tokens=None,
        pos_slice=None,
        batch_slice=None,
        has_batch_dim=True,
    ):
        """Each component's direct effect on the logit of ``tokens`` (minus that of
        ``incorrect_tokens``) through the final norm frozen from the cache: ``[C, ...]``.
        ``tokens``: an id, ``[B]`` or ``[B,T]`` ids, broadcast against the stack's batch and
        position axes as TransformerLens does."""
        directions = self.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            if jnp.shape(tokens) != jnp.shape(incorrect_tokens):
                raise ValueError(
                    f"tokens {jnp.shape(tokens)} and incorrect_tokens "
                    f"{jnp.shape(incorrect_tokens)} must have the same shape"
                )
            directions = directions - self.tokens_to_residual_directions(incorrect_tokens)
        scaled = self.apply_ln_to_stack(
            residual_stack,
            -1,
            pos_slice=pos_slice,
            batch_slice=batch_slice,
            has_batch_dim=has_batch_dim,
        )
        per_row = has_batch_dim and not isinstance(batch_slice, int) and scaled.ndim == 4
        if per_row and directions.ndim == 2 and directions.shape[0] == scaled.shape[1]:
            directions = directions[:, None]  # [B,D] against [C,B,T,D]
        return jnp.sum(scaled * lead(directions, scaled.ndim), axis=-1)
