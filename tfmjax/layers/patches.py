"""Images as sequences (ViT, Dosovitskiy et al. 2021): patches, their projection, the class
token and a learned position per slot.

Letters beside the house ones (``B`` batch, ``D`` width): an image is ``[B, Hi, Wi, C]``
(height, width, channels); with patches of ``p x p`` pixels it is a ``Y x X`` grid
(``Y = Hi / p`` rows, ``X = Wi / p`` columns) of ``P = Y X`` patches, each flattened to
``I = p p C`` numbers, pixel rows first, then pixel columns, then channels (einops:
``"b (y p1) (x p2) c -> b (y x) (p1 p2 c)"``). Patch ``k`` is grid row ``k // X``, column
``k % X``; slot 0 of the sequence is the class token, slot ``1 + k`` patch ``k``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tfmjax.layers.axes import EMBED, named
from tfmjax.layers.hooks import hook


def image_patches(images, patch_size: int):
    """``[B, Hi, Wi, C] -> [B, P, I]``: the ``patch_size`` squares of each image, row-major
    over the grid, each flattened (pixel row, pixel column, channel)."""
    B, Hi, Wi, C = images.shape
    p = patch_size
    if Hi % p or Wi % p:
        raise ValueError(f"patch_size {p} must divide the image's height {Hi} and width {Wi}")
    grid = images.reshape(B, Hi // p, p, Wi // p, p, C)  # [B, Y, p1, X, p2, C]
    grid = jnp.einsum("BYyXxC->BYXyxC", grid)
    return grid.reshape(B, (Hi // p) * (Wi // p), p * p * C)


def patch_labels(image_size: int, patch_size: int) -> list[str]:
    """The name of each slot of a patch sequence: ``cls``, then ``patch k (rY,cX)``."""
    X = image_size // patch_size
    return ["cls"] + [f"patch {k} (r{k // X},c{k % X})" for k in range(X * X)]


class PatchEmbedding(nn.Module):
    """``images [B, Hi, Wi, C] -> [B, 1 + P, D]``: each patch flattened and projected
    (``patch_proj``: kernel ``[I, D]``, bias ``[D]``), the learned ``cls_token [D]`` put first,
    and with ``learned_positions`` a learned ``pos_embedding [1 + P, D]`` added (slot 0: the
    class token). Hooks ``encoder.hook_embed`` (the class token and the projected patches)
    and ``encoder.hook_pos_embed``."""

    patch_size: int
    num_patches: int
    d_model: int
    learned_positions: bool = True
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, images):
        patches = image_patches(images, self.patch_size)  # [B, P, I]
        B, P, I = patches.shape
        if P != self.num_patches:
            raise ValueError(f"images give {P} patches, the embedding has {self.num_patches}")
        D = self.d_model
        kernel = self.param("kernel", named(nn.linear.default_kernel_init, None, EMBED), (I, D))
        bias = self.param("bias", named(nn.initializers.zeros_init(), EMBED), (D,))
        cls = self.param("cls_token", named(nn.initializers.normal(0.02), EMBED), (D,))
        x = jnp.einsum("BPI,ID->BPD", patches.astype(self.dtype), kernel.astype(self.dtype))
        x = x + bias.astype(self.dtype).reshape(1, 1, D)
        x = jnp.concatenate([jnp.broadcast_to(cls.astype(self.dtype), (B, 1, D)), x], axis=1)
        x = hook(self, "encoder.hook_embed", x)
        if self.learned_positions:
            init = named(nn.initializers.normal(0.02), None, EMBED)
            table = self.param("pos_embedding", init, (1 + P, self.d_model))
            pe = jnp.broadcast_to(table.astype(self.dtype), x.shape)
            x = x + hook(self, "encoder.hook_pos_embed", pe)
        return x
