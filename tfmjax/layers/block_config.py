"""The hyper-parameters of one transformer block, read from the model config by
``tfmjax.models`` (:func:`tfmjax.models.common.block_config`).

Each field carries the name of its ``ModelConfig`` field, resolved: ``num_kv_heads``,
``head_dim``, ``kv_rank``, ``rope_dim``, ``attention_bias`` and ``mlp_bias`` are never None
here (the config's defaults are applied), ``rope_base`` is None without RoPE and ``dtype`` is
the compute dtype. The attention modules build themselves from it (``from_block_config``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp


class BlockConfig(NamedTuple):
    """The hyper-parameters a block needs (see the module docstring)."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    d_ff: int
    activation: str = "relu"
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    attention_bias: bool = True  # attention projections
    mlp_bias: bool = True
    dropout_rate: float = 0.0
    rope_base: float | None = None
    rope_layout: str = "interleaved"
    window: int | None = None
    attention_stride: int | None = None  # strided sparse pattern (self-attention)
    global_tokens: int = 0  # global tokens (self-attention)
    random_blocks: Any = None  # kernels.masks.RandomBlocks from the three random_* fields
    attention: str = "softmax"  # self-attention variant (tfmjax.layers.attention_variants)
    kv_rank: int = 0  # mla latent width
    q_rank: int | None = None  # mla query latent
    rope_dim: int = 0  # mla decoupled RoPE features
    feature_map: str = "elu"  # linear attention
    num_features: int = 64  # linear attention with favor
    ssm_state: int = 16  # selective_scan: state size P per channel
    ssm_expand: int = 2  # selective_scan: channels E = ssm_expand * d_model
    ssm_conv: int = 4  # selective_scan: causal convolution width W
    num_landmarks: int = 8  # nystrom: landmarks M
    nystrom_conv: int = 0  # nystrom: width of the depthwise convolution over V; 0: none
    max_len: int = 0  # linformer: the positions T_max its sequence projections span
    linformer_rank: int = 8  # linformer: projected keys/values R (the paper's k)
    linformer_share_kv: bool = False  # linformer: one projection for keys and values
    lsh_buckets: int = 8  # lsh: hash buckets per round
    lsh_rounds: int = 2  # lsh: hash rounds
    lsh_chunk: int = 32  # lsh: tokens per chunk of the sorted row
    lsh_seed: int = 0  # lsh: seed of the fixed rotations
    scale_attention: bool = True  # logits times 1/sqrt(head_dim); False: unscaled
    attention_impl: str = "auto"
    moe_experts: int = 0  # experts of the blocks whose feed-forward is a mixture
    moe_top_k: int = 1
    moe_capacity_factor: float = 0.0  # with dropout (training); 0: dropless
    moe_eval_capacity_factor: float = 0.0  # without (evaluation, decoding, interp)
    moe_renormalize: bool = False  # resolved from the config's None
    dtype: Any = jnp.float32

    @property
    def attention_scale(self) -> float | None:
        """The kernels' ``scale``: None (``1/sqrt(head_dim)``) or 1.0 (unscaled)."""
        return None if self.scale_attention else 1.0
