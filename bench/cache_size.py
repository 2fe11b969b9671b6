"""Decoding cache size per attention system: MHA, GQA, MQA, MLA, linear attention, retention,
the selective scan and RWKV.

    python bench/cache_size.py [--width 768 --heads 12 --layers 12]

For one model width (default GPT-2 small's: 12 layers, 12 heads of 64), the bytes the
self-attention cache of a decoder-only model holds for a batch of one at several context
lengths, measured from the cache pytree (``jax.eval_shape`` of ``model.init_cache``: no
memory is allocated) and checked against the formula (``model.kv_cache_bytes``):
  MHA / GQA / MQA   2 · L · K · S · H        (K = 12, 4, 1 key/value heads)
  MLA               L · S · (R + Hr)         (latent R = 4H = 256, decoupled RoPE Hr = 32)
  linear            L · K · (F · (H + 1) + 1) (state; F = H for elu), whatever S is
  retention         L · N · H · H            (state S per head), whatever S is
  selective scan    L · E · (P + W - 1)      (scan state, last W-1 conv inputs; E = 2D,
                                              P = 16, W = 4), whatever S is
  rwkv              L · D · 5                (WKV numerator, denominator, exponent; the last
                                              inputs of time-mix and channel-mix), whatever S is
float32 throughout; segment ids and indices are not counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from tfmjax.config import ModelConfig  # noqa: E402
from tfmjax.models import build  # noqa: E402


def systems(width: int, heads: int, layers: int) -> dict[str, ModelConfig]:
    base = dict(
        family="decoder_only",
        vocab_size=64,
        d_model=width,
        num_heads=heads,
        d_ff=4 * width,
        num_layers=layers,
        max_len=16384,
        position="rope",
    )
    H = width // heads
    return {
        "MHA": ModelConfig(**base),
        "GQA (K=4)": ModelConfig(**base, num_kv_heads=4),
        "MQA (K=1)": ModelConfig(**base, num_kv_heads=1),
        f"MLA (R={4 * H}, Hr={H // 2})": ModelConfig(**base, attention="mla"),
        "linear (elu)": ModelConfig(**base, attention="linear"),
        "retention": ModelConfig(**base, attention="retention"),
        "selective_scan (P=16)": ModelConfig(
            **dict(base, position="none"), attention="selective_scan"
        ),
        "rwkv": ModelConfig(**dict(base, position="none"), attention="rwkv"),
    }


def measured_bytes(cfg: ModelConfig, length: int) -> int:
    model = build(cfg)
    cache = jax.eval_shape(lambda: model.init_cache(1, length))
    return sum(
        a.size * a.dtype.itemsize
        for sa in cache.self_attention
        for name, a in sa.items()
        if name not in ("segment_ids", "index")
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args(argv)
    lengths = (1024, 4096, 16384)
    configs = systems(args.width, args.heads, args.layers)
    print(
        f"decoder-only, width {args.width}, {args.heads} heads, {args.layers} layers, "
        "batch 1, float32; bytes from the cache pytree (= formula)"
    )
    header = f"{'attention':<22}" + "".join(f"{f'S={n}':>14}" for n in lengths)
    print(header + f"{'per token':>12}{'vs MHA':>9}")
    mha_per_token = None
    for name, cfg in configs.items():
        sizes = [measured_bytes(cfg, n) for n in lengths]
        for n, size in zip(lengths, sizes, strict=True):
            formula = build(cfg).kv_cache_bytes(1, n)
            assert size == formula, (name, n, size, formula)
        per_token = sizes[-1] / lengths[-1]
        mha_per_token = mha_per_token or per_token
        cells = "".join(f"{size / 2**20:>11.2f} MB" for size in sizes)
        print(f"{name:<22}{cells}{per_token:>10.0f} B{mha_per_token / per_token:>8.1f}x")
    print(
        "linear attention's, retention's, the selective scan's and rwkv's states do not grow "
        "with S: "
        "their 'per token' is at S=16384."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
