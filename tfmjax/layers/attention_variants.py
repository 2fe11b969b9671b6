"""The self-attention variants, one table: ``model.attention`` name -> module class.

Each class builds itself from a block's config and owns its decoding cache:

* ``from_block_config(cfg, name)``: the module of a block (:mod:`tfmjax.layers.block_config`);
* ``init_cache(cfg, batch, capacity)``: one layer's empty decoding cache (a dict);
* ``cache_bytes(cfg, batch, num_layers, capacity)``: that cache's bytes by formula (segment
  ids and indices aside), for ``num_layers`` layers;
* ``qk_ov_circuits``: whether per-head query, key, value and out kernels make the QK/OV
  circuits of :mod:`tfmjax.interp.circuits` (optional: ``qk_circuit``, true where the QK
  circuit applies without the OV one, and ``circuits_refused``, the reason given when they
  are refused);
* ``causal_only``: no bidirectional form (:data:`CAUSAL_ONLY`): an encoder keeps softmax
  self-attention and an encoder_only model refuses it;
* ``bidirectional_only``: no causal form (:data:`BIDIRECTIONAL_ONLY`), the reverse: a
  decoder keeps softmax self-attention and a decoder_only model refuses it;
* ``feed_forward`` (optional): the module class that replaces the feed-forward of the blocks
  the variant mixes in (rwkv's channel-mix): ``from_block_config(cfg, name)``, called as
  ``ff(x, segment_ids, cache, deterministic=...) -> (y, cache)``, reading and writing its own
  entries of the variant's per-layer cache (which ``init_cache`` and ``cache_bytes`` cover).

Adding a variant (a recurrent mixer such as retention, the selective scan or rwkv included) is one
module with those members and one entry here; the config validates ``model.attention``
against :data:`ATTENTION_NAMES`.
"""

from __future__ import annotations

from tfmjax.layers.attention import MultiHeadAttention
from tfmjax.layers.latent_attention import LatentAttention
from tfmjax.layers.linear_attention import LinearAttention
from tfmjax.layers.linformer_attention import LinformerAttention
from tfmjax.layers.lsh_attention import LSHAttention
from tfmjax.layers.nystrom_attention import NystromAttention
from tfmjax.layers.retention import Retention
from tfmjax.layers.rwkv import RWKVTimeMix
from tfmjax.layers.selective_scan import SelectiveScan

ATTENTION_VARIANTS: dict[str, type] = {
    "softmax": MultiHeadAttention,  # MHA / GQA / MQA
    "mla": LatentAttention,  # multi-head latent attention
    "linear": LinearAttention,  # kernelised, constant-size state
    "retention": Retention,  # RetNet's multi-scale retention: causal, decaying state
    "selective_scan": SelectiveScan,  # a Mamba mixer: causal, convolution + scan state
    "rwkv": RWKVTimeMix,  # RWKV-4's time-mix (and channel-mix feed-forward): causal, WKV state
    "nystrom": NystromAttention,  # Nyströmformer: landmarks, bidirectional only
    "linformer": LinformerAttention,  # Linformer: sequence projections, bidirectional only
    "lsh": LSHAttention,  # Reformer: shared-QK hashed into buckets, sorted chunks
}
# Variants with no bidirectional form: an encoder keeps softmax self-attention.
CAUSAL_ONLY: tuple[str, ...] = tuple(n for n, v in ATTENTION_VARIANTS.items() if v.causal_only)
# Variants with no causal form: a decoder keeps softmax self-attention.
BIDIRECTIONAL_ONLY: tuple[str, ...] = tuple(
    n for n, v in ATTENTION_VARIANTS.items() if v.bidirectional_only
)
ATTENTION_NAMES: tuple[str, ...] = tuple(ATTENTION_VARIANTS)
