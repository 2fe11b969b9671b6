"""The one table that maps logical axis names (:mod:`tfmjax.layers.axes`) onto mesh axes.

Rule sets (``mesh.rules``), each a priority list of ``(logical name, mesh axes)`` pairs in
Flax's format (``flax.linen.logical_axis_rules``): for each array, the first rule whose mesh
axes are still free in that array's layout wins, so the activations' ``embed`` stays whole
where ``batch`` already took ``fsdp``, while the params' ``embed`` is split over it.

``standard``
    data parallelism over ``data``; FSDP over ``fsdp`` (every param's ``embed`` axis split,
    the batch split over ``data x fsdp``; XLA gathers each layer's params where the layer
    runs, inside the scan); Megatron tensor parallelism over ``tensor`` (query and
    key/value heads, the FFN width and the vocabulary split; the residual stream whole);
    expert parallelism over ``expert`` (GShard): the experts of mixture-of-experts layers
    split, and the batch too, so the rest of the model sees ``expert`` as more data
    parallelism; XLA moves each expert's tokens to its devices (all-to-all) where the
    dispatched ``[E,B,C,D]`` activations are constrained to the experts' split.
    On a mesh of sizes ``(n, 1, 1)`` this is plain data parallelism.
``replicated``
    every device holds all params and optimizer state; the batch is split over all three
    mesh axes: data parallelism whatever the mesh's shape. The baseline to compare with,
    and the cheapest for models small enough that gathering costs more than it saves.

:func:`rules_for` drops the rules of axes whose size the mesh axes do not divide (e.g. 2
key/value heads on ``tensor = 4``: they stay whole on every device, as Megatron does for
MQA), so every array it shards splits evenly.
"""

from __future__ import annotations

import math

from tfmjax.config import ModelConfig
from tfmjax.layers.axes import BATCH, EMBED, EXPERT, HEADS, KV_HEADS, MLP, VOCAB

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

RULE_SETS: dict[str, Rules] = {
    "standard": (
        (EXPERT, "expert"),
        (BATCH, ("data", "fsdp", "expert")),
        (BATCH, ("data", "fsdp")),  # an array whose experts took the expert axis
        (VOCAB, "tensor"),
        (HEADS, "tensor"),
        (KV_HEADS, "tensor"),
        (MLP, "tensor"),
        (EMBED, "fsdp"),
    ),
    "replicated": ((BATCH, ("data", "fsdp", "expert", "tensor")),),
}


def axis_sizes(model: ModelConfig) -> dict[str, int]:
    """The size of each named model axis (the batch aside)."""
    return {
        EMBED: model.d_model,
        HEADS: model.num_heads,
        KV_HEADS: model.kv_heads,
        MLP: model.d_ff,
        VOCAB: model.vocab_size,
        EXPERT: model.moe_experts,
    }


def rules_for(name: str, model: ModelConfig, mesh_shape: dict[str, int]) -> Rules:
    """Rule set ``name`` for ``model`` on a mesh of ``mesh_shape`` (``{"data": 2, ...}``):
    the rules of model axes that would not split evenly are left out."""
    sizes = axis_sizes(model)
    kept = []
    for logical, mesh_axes in RULE_SETS[name]:
        axes = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
        ways = math.prod(mesh_shape[a] for a in axes)
        if logical in sizes and sizes[logical] % ways:
            continue
        kept.append((logical, mesh_axes))
    return tuple(kept)


def batch_axes(rules: Rules) -> tuple[str, ...]:
    """The mesh axes the batch is split over."""
    for logical, mesh_axes in rules:
        if logical == BATCH:
            return (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
    return ()
