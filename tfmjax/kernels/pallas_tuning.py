"""Tile sizes and launch settings of the Pallas flash kernels (:mod:`.pallas_attention`), and
the table of Triton settings measured on GPUs.

:class:`BlockSizes`: the block lengths of the forward, dK/dV and dQ kernels, on every
platform. :class:`Launch`: each Triton kernel's ``num_warps`` and ``num_stages`` (Triton's
software-pipelining depth; GPU only). :func:`triton_settings` is what a cuda call with no
explicit ``block_sizes`` runs: the row of :data:`TUNED` for the GPU family, head width and
causality of the call, at the measured sequence length nearest ``sqrt(T * S)`` on a log
scale; with no such row, :meth:`BlockSizes.for_platform` and :data:`DEFAULT_LAUNCH`.

:data:`TUNED` is written by ``python bench/triton_sweep.py --record RESULT.json`` from a
sweep on the device (``tools/device_check.sh triton-sweep``): for each shape, each kernel's
blocks, warps and stages, searched one kernel at a time (forward alone, then dK/dV, then dQ
with the others fixed at their best), and kept only where it beat the defaults in the same
run. Settings never move numbers beyond a kernel's rounding: blocks change the order of the
online-softmax sums, warps and stages do not change them at all.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax

GPU_PLATFORMS = ("cuda", "gpu", "rocm")
KERNELS = ("fwd", "dkv", "dq")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Block lengths (powers of two) of the forward, dK/dV and dQ kernels.

    Blocks are clipped to the (power-of-two rounded) sequence lengths, so short inputs
    use one block. Triton needs blocks of at least 16. On TPU, blocks sliced along the
    lane dimension inside a kernel (``block_k``/``block_k_dq`` with segment ids,
    ``block_q_dkv`` always) should be multiples of 128 unless they span the sequence.
    :meth:`for_platform` gives the defaults; on cuda :func:`triton_settings` may replace
    them by measured ones.
    """

    block_q: int = 128
    block_k: int = 128
    block_q_dkv: int = 128
    block_k_dkv: int = 128
    block_q_dq: int = 128
    block_k_dq: int = 128

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"BlockSizes.{f.name}={value!r} must be a power of two")

    @classmethod
    def for_platform(cls, platform: str | None, head_dim: int = 64) -> BlockSizes:
        """GPU: the FlashAttention-2 Triton tutorial's tiles (fwd 128x64; dK/dV: 32 query
        rows per 128 keys; dQ: 128 query rows per 32 keys) for heads up to 128 wide, halved
        up to 256 and quartered beyond (never under 16), so the tiles stay within a GPU's
        shared memory: MLA's absorbed decoding heads (``R + Hr = 288`` wide at GPT-2 small's
        width) asked an H200 for 395,520 bytes of its 232,448 at the full tiles. TPU and
        CPU: 128 everywhere (one MXU tile / 128 lanes, as jax's own TPU flash attention)."""
        if (platform or jax.default_backend()).lower() in GPU_PLATFORMS:
            shrink = 1 if head_dim <= 128 else 2 if head_dim <= 256 else 4
            tiles = (128, 64, 32, 128, 128, 32)
            return cls(*(max(16, tile // shrink) for tile in tiles))
        return cls()

    def of(self, kernel: str) -> tuple[int, int]:
        """``(query block, key block)`` of ``kernel`` (one of :data:`KERNELS`)."""
        suffix = {"fwd": "", "dkv": "_dkv", "dq": "_dq"}[kernel]
        return getattr(self, "block_q" + suffix), getattr(self, "block_k" + suffix)


@dataclasses.dataclass(frozen=True)
class Launch:
    """``(num_warps, num_stages)`` of each Triton kernel: forward, dK/dV, dQ."""

    fwd: tuple[int, int] = (4, 2)
    dkv: tuple[int, int] = (4, 2)
    dq: tuple[int, int] = (4, 2)

    def __post_init__(self):
        for kernel in KERNELS:
            warps, stages = pair = tuple(getattr(self, kernel))  # a list from JSON: hashable
            object.__setattr__(self, kernel, pair)
            ints = all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
            if not ints or warps not in (1, 2, 4, 8, 16) or not 1 <= stages <= 8:
                raise ValueError(
                    f"Launch.{kernel}=({warps}, {stages}): num_warps must be 1, 2, 4, 8 or 16 "
                    "and num_stages 1-8"
                )


DEFAULT_LAUNCH = Launch()

# (GPU family, sequence length, head width padded to a power of two, causal):
#   (fwd, dkv, dq), each (query block, key block, num_warps, num_stages).
# Rows between the markers are rewritten by ``bench/triton_sweep.py --record``; each names
# its device, date and the default's and the row's forward+backward milliseconds.
TUNED: dict[tuple[str, int, int, bool], tuple[tuple[int, int, int, int], ...]] = {
    # tuned rows
    # /tuned rows
}

_FAMILIES = (  # (family, pattern over jax's device_kind)
    ("hopper", r"\b(H100|H200|H800|H20|GH200)\b"),
    ("blackwell", r"\b(B100|B200|GB200|B300|GB300)\b"),
    ("ampere", r"\b(A100|A800|A10|A30|A40|A6000)\b"),
    ("ada", r"\b(L4|L40S?|RTX 40\d0|RTX 6000 Ada)\b"),
)


def gpu_family(device_kind: str | None) -> str | None:
    """``"hopper"``, ``"blackwell"``, ``"ampere"``, ``"ada"`` from a jax ``device_kind``
    (e.g. ``"NVIDIA H100 80GB HBM3"``); None for anything else."""
    for family, pattern in _FAMILIES:
        if device_kind and re.search(pattern, device_kind):
            return family
    return None


def lowering_gpu_kind() -> str | None:
    """The GPU kind a cuda lowering builds for: this host's first GPU, else the abstract
    device of the current abstract mesh (a CPU host exporting for cuda inside
    :func:`tfmjax.compat.gpu_lowering_target`), else None."""
    if jax.default_backend() == "gpu":
        return jax.devices()[0].device_kind
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return getattr(device, "device_kind", None)


def triton_settings(
    q_len: int, kv_len: int, head_dim: int, causal: bool, device_kind: str | None
) -> tuple[BlockSizes, Launch, tuple | None]:
    """``(blocks, launch, row key)`` for a cuda call: the nearest :data:`TUNED` row of this
    GPU family, head width and causality (``row key`` None: no row, the defaults)."""
    width = 1 << max(head_dim - 1, 0).bit_length()
    family = gpu_family(device_kind)
    keys = [key for key in TUNED if key[0] == family and key[2] == width and key[3] == causal]
    if not keys:
        return BlockSizes.for_platform("cuda", head_dim), DEFAULT_LAUNCH, None
    length = math.sqrt(max(q_len, 1) * max(kv_len, 1))
    key = min(keys, key=lambda key: (abs(math.log2(key[1] / length)), key[1]))
    fwd, dkv, dq = TUNED[key]
    blocks = BlockSizes(*fwd[:2], *dkv[:2], *dq[:2])
    return blocks, Launch(fwd[2:], dkv[2:], dq[2:]), key
