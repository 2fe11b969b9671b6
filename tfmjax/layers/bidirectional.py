"""What the bidirectional-only self-attention variants share (Nyström, Linformer): no causal
form, so no decoding cache; a decoder keeps softmax self-attention (``tfmjax.models.common``)."""

from __future__ import annotations

from typing import ClassVar

from tfmjax.layers.block_config import BlockConfig


class BidirectionalOnly:
    """Mixin of a variant with no causal form: its flags and its refused cache (one line)."""

    variant: ClassVar[str]  # its model.attention name
    causal_only: ClassVar[bool] = False
    bidirectional_only: ClassVar[bool] = True

    @classmethod
    def refusal(cls, lacks: str = "no decoding cache") -> str:
        return f"model.attention={cls.variant!r} is bidirectional only and has {lacks}"

    @classmethod
    def init_cache(cls, c: BlockConfig, batch: int, capacity: int) -> dict:
        """Refused: there is no decoding form (decoders keep softmax self-attention)."""
        raise ValueError(cls.refusal())

    @classmethod
    def cache_bytes(cls, c: BlockConfig, batch: int, num_layers: int, capacity: int) -> int:
        """Refused, as :meth:`init_cache`."""
        raise ValueError(cls.refusal())

    def refuse_causal(self, causal: bool, cache) -> None:
        """A causal call or a decoding cache is refused in one line."""
        if causal or cache is not None:
            raise ValueError(self.refusal("no causal form"))
