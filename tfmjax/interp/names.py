"""TransformerLens's short activation names, read as hook names of :mod:`tfmjax.layers.hooks`.

``act_name("pattern", 0)`` is ``"blocks.0.attn.hook_pattern"``, as TransformerLens's
``get_act_name`` writes it (Nanda and Bloom 2022): a word with an optional layer and layer
type, or one string holding all three (``"k6"``, ``"scale4ln1"``, ``"normalized0ln2"``).
``canonical`` maps TransformerLens 4's block-level aliases (``blocks.0.hook_q_input``) to the
attention-level names the hooks carry (``blocks.0.attn.hook_q_input``). Both return names
without a stack prefix; :func:`tfmjax.interp.hooked.resolve` matches them as suffixes.
"""

from __future__ import annotations

import re

# Activations of the attention and the MLP: their layer type is implied.
_ATTENTION = frozenset({"k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores"})
# ... and the hook points of retention, Nyström and Linformer attention, which
# TransformerLens lacks.
_ATTENTION |= {"decayed_scores", "state", "gate", "landmarks_q", "landmarks_k"}
_ATTENTION |= {"kernel_f", "kernel_a", "kernel_b", "k_proj", "v_proj"}
# ... and of the selective scan (under the block's attn. too).
_ATTENTION |= {"conv_in", "ssm_input", "delta", "B", "C", "h", "ssm_state", "ssm_output"}
_ATTENTION |= {"ssm_gate"}
# ... and of rwkv's time-mix (its channel-mix's receptance is an MLP hook).
_ATTENTION |= {"rwkv_r", "rwkv_k", "rwkv_v", "wkv"}
_MLP = frozenset({"pre", "post", "mid", "pre_linear", "receptance"})
_NORM = frozenset({"scale", "normalized"})  # without a layer: the final norm's
_WORD_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_mid": "mid",
    "mlp_post": "post",
}
_TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}
_PACKED = re.compile(r"([a-z_]+?)(\d+)([a-z]\w*)?$")  # "scale4ln1" -> scale, 4, ln1
_BLOCK_ALIAS = re.compile(r"(blocks\.(?:\d+|\*))\.(hook_(?:attn_in|q_input|k_input|v_input))$")


def act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """The hook name TransformerLens gives ``(name, layer, layer_type)``; a name that is
    already a hook name (dotted, or ``hook_...``) comes back as it is."""
    if layer is None and layer_type is None:
        if "." in name or name.startswith("hook_"):
            return name
        packed = _PACKED.match(name)
        if packed:
            name, layer, layer_type = packed.group(1), int(packed.group(2)), packed.group(3)
    name = _WORD_ALIASES.get(name, name)
    if name in _ATTENTION:
        layer_type = "attn"
    elif name in _MLP:
        layer_type = "mlp"
    else:
        layer_type = _TYPE_ALIASES.get(layer_type, layer_type)
    parts = [f"blocks.{layer}"] if layer is not None else []
    if layer is None and name in _NORM:
        parts.append("ln_final")
    if layer_type:
        parts.append(layer_type)
    return ".".join([*parts, f"hook_{name}"])


def canonical(name: str) -> str:
    """``name`` with a block-level split-input alias replaced by the attention's own name."""
    return _BLOCK_ALIAS.sub(r"\1.attn.\2", name)
