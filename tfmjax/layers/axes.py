"""Logical axis names of parameters and activations, for sharding on a device mesh.

Layers name the axes of the arrays they create (:func:`named`, :func:`dense_inits`) and of
the main activations they compute (:func:`constrain`); one table of rules in
:mod:`tfmjax.parallel.rules` maps the names onto mesh axes. The math never names a mesh
axis. Outside a mesh with rules in force (one device), :func:`constrain` returns its input
unchanged, and ``Family.init`` drops the names from the params it returns, so a model's
params are plain arrays. A single layer's own ``init`` returns them boxed, as Flax's
``with_logical_partitioning`` does; ``nn.unbox(params)`` drops the names.
"""

from __future__ import annotations

import flax.linen as nn
from flax.core import meta

BATCH = "batch"
LENGTH = "length"
EMBED = "embed"  # the model width D
HEADS = "heads"  # query heads N
KV_HEADS = "kv_heads"  # key/value heads K
HEAD_WIDTH = "head_width"  # H
MLP = "mlp"  # the FFN width F
VOCAB = "vocab"
LAYERS = "layers"  # the leading axis of a scanned stack's params
EXPERT = "expert"  # the experts E of a mixture-of-experts feed-forward

AXES = (BATCH, LENGTH, EMBED, HEADS, KV_HEADS, HEAD_WIDTH, MLP, VOCAB, LAYERS, EXPERT)


class LogicalNames(meta.Partitioned):
    """A param with the logical names of its axes, as ``Family.init`` drops them and
    ``Family.param_axes`` reads them (``nn.get_partition_spec``). Unlike Flax's own boxes,
    reading the value never adds a sharding constraint: where params live is decided once,
    by the train state's shardings (and ``nn.DenseGeneral`` reads its kernel flat before
    reshaping it, which a constraint by the reshaped names would reject)."""

    def unbox(self, apply_constraint: bool = True):
        return self.value


def named(init, *names: str | None):
    """``init`` whose array carries the logical ``names`` (one per axis; None: unnamed)."""

    def init_named(*args, **kwargs):
        return LogicalNames(init(*args, **kwargs), names)

    return init_named


def dense_inits(kernel: tuple, bias: tuple) -> dict:
    """``kernel_init`` / ``bias_init`` keyword arguments of ``nn.Dense`` / ``nn.DenseGeneral``
    (Flax's default initialisers) with the kernel's and the bias's axis names."""
    return {
        "kernel_init": named(nn.linear.default_kernel_init, *kernel),
        "bias_init": named(nn.initializers.zeros_init(), *bias),
    }


def constrain(x, *names: str | None):
    """``x`` laid out on the mesh as the rules map ``names`` (one per axis of ``x``); ``x``
    itself when no mesh and rules are in force."""
    return nn.with_logical_constraint(x, names)
