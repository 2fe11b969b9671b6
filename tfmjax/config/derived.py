"""The sizes and switches :class:`~tfmjax.config.model.ModelConfig` derives from its fields
(a mixin of properties: widths, head counts, vocabulary columns, resolved defaults)."""

from __future__ import annotations


class DerivedSizes:
    """Read-only properties over a ModelConfig's fields (no fields of its own)."""

    @property
    def projected_vocab(self) -> int:
        """Columns of the output projection: ``vocab_size`` rounded up to ``vocab_multiple``."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def latent_kv_rank(self) -> int:
        """MLA's latent width ``R`` (default: 4 head widths, DeepSeek-V2's ratio)."""
        return 4 * self.head_width if self.kv_rank is None else self.kv_rank

    @property
    def mla_rope_dim(self) -> int:
        """MLA's decoupled RoPE features per head (default: half the head width)."""
        if self.position != "rope":
            return 0
        return self.head_width // 2 if self.rope_dim is None else self.rope_dim

    @property
    def randomizes_token_positions(self) -> bool:
        """Randomized sampling of token positions (Abacus randomizes its digit places
        instead, :func:`tfmjax.models.common.draw_abacus_places`)."""
        return self.position_sampling == "randomized" and self.position != "abacus"

    @property
    def position_rows(self) -> int:
        """Positions a model may see: ``max_position`` under randomized sampling, else
        ``max_len`` (the rows of a learned table, before ``position_offset``)."""
        if self.position_sampling == "randomized" and self.max_position is not None:
            return max(self.max_len, self.max_position)
        return self.max_len

    @property
    def num_patches(self) -> int:
        """Patches ``P`` of an image (``model.input = "patches"``; 0 for token input): the
        encoder reads ``P + 1`` positions, the class token first."""
        if self.input != "patches":
            return 0
        return (self.image_size // self.patch_size) ** 2

    @property
    def patch_dim(self) -> int:
        """Numbers in one flattened patch, ``patch_size^2 * channels`` (0 for token input)."""
        return self.patch_size**2 * self.channels if self.input == "patches" else 0

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_width(self) -> int:
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def attention_uses_bias(self) -> bool:
        return self.use_bias if self.attention_bias is None else self.attention_bias

    @property
    def mlp_uses_bias(self) -> bool:
        return self.use_bias if self.mlp_bias is None else self.mlp_bias

    @property
    def moe_renormalizes(self) -> bool:
        """Whether MoE gates are renormalised over the chosen experts (``moe_renormalize``
        resolved: by default for ``moe_top_k > 1``)."""
        return self.moe_top_k > 1 if self.moe_renormalize is None else self.moe_renormalize

    @property
    def moe_eval_capacity(self) -> float:
        """The MoE capacity factor of a forward without dropout (``moe_eval_capacity_factor``
        resolved: None is the training factor)."""
        if self.moe_eval_capacity_factor is None:
            return self.moe_capacity_factor
        return self.moe_eval_capacity_factor

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers
