"""Sparse attention patterns against full causal attention in the blockwise kernel: does block
skipping turn a sparser pattern into less time?

    python bench/sparse_attention.py                  # T = 1024, 4096, 16384; minutes on 2 cores
    python bench/sparse_attention.py --max-len 1024   # a quick run
    python bench/sparse_attention.py --block 256      # every kernel block 256 x 256

Shapes: B=1, N=K=4, H=64, causal, float32, ``impl="blockwise"`` with its default blocks
(forward 1024 x 1024, backward 256 x 512) or ``--block`` for all. Patterns:

* ``causal``: full causal attention (the baseline);
* ``window``: a sliding window of 256 past positions;
* ``window+global``: the window and 64 global tokens (Longformer, Beltagy et al. 2020);
* ``bigbird``: the window, 64 global tokens and 2 random key blocks of 64 per query block of
  64 (BigBird, Zaheer et al. 2020);
* ``bigbird-256``: the window, 64 global tokens and 1 random key block of 256 per query block
  of 256 (a random block as long as a ``--block 256`` kernel block: each costs one block).

Each (T, pattern, mode) is compiled first, then timed in interleaved rounds (every cell once
per round, so load from other processes hits all alike); the table shows medians. Modes:
``fwd`` and ``fwd+bwd`` (``jit(grad(sum(out)))`` wrt q, k, v). ``causal/this``: the
baseline's time over this pattern's (> 1: faster). ``visited``: the fraction of the causal
(query block, key block) pairs of the forward pass that the kernel visits (from
``block_geometry.pattern_ranges``: what skipping can save at most). Memory: XLA's temp
buffers of the compiled executable (inputs and outputs excluded).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfmjax.kernels import blockwise  # noqa: E402
from tfmjax.kernels.block_geometry import pattern_ranges  # noqa: E402
from tfmjax.kernels.masks import RandomBlocks  # noqa: E402

# The timing loop of the linear-attention bench (compile, then interleaved rounds).
_spec = importlib.util.spec_from_file_location(
    "bench_linear_attention", Path(__file__).with_name("linear_attention.py")
)
_linear = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_linear)

B, N, H = 1, 4, 64
LENGTHS = (1024, 4096, 16384)
WINDOW, GLOBAL = 256, 64
PATTERNS = {
    "causal": {},
    "window": dict(window=WINDOW),
    "window+global": dict(window=WINDOW, global_tokens=GLOBAL),
    "bigbird": dict(window=WINDOW, global_tokens=GLOBAL, random_blocks=RandomBlocks(2, 64)),
    "bigbird-256": dict(window=WINDOW, global_tokens=GLOBAL, random_blocks=RandomBlocks(1, 256)),
}


def attention_fn(pattern: dict, blocks: blockwise.BlockSizes):
    def fn(q, k, v):
        return blockwise.attention(
            q,
            k,
            v,
            causal=True,
            q_segment_ids=None,
            kv_segment_ids=None,
            window=pattern.get("window"),
            alibi_slopes=None,
            bias=None,
            q_offset=0,
            scale=H**-0.5,
            global_tokens=pattern.get("global_tokens", 0),
            random_blocks=pattern.get("random_blocks"),
            block_sizes=blocks,
        )

    return fn


def visited_fraction(T: int, pattern: dict, block: int) -> float:
    """Visited (query block, key block) pairs over the causal ones, blocks of ``block``."""
    n = -(-T // block)
    options = dict(
        causal=True,
        window=pattern.get("window"),
        stride=None,
        global_tokens=pattern.get("global_tokens", 0),
        random_blocks=pattern.get("random_blocks"),
    )
    visited = 0
    for i in range(n):
        r = pattern_ranges(i * block, i * block + block - 1, block, n, **options, num_full=n)
        count = int(r.hi) - int(r.lo) + (0 if r.glo is None else int(r.ghi) - int(r.glo))
        if r.random is not None:
            candidates = [*range(int(r.rlo), int(r.lo)), *range(int(r.hi), int(r.rhi))]
            count += sum(bool(r.random(jnp.int32(j))) for j in candidates)
        visited += count
    return visited / (n * (n + 1) / 2)


def bench(lengths, rounds, blocks):
    """``{(T, pattern, mode): {"time", "temp", ...}}`` (the linear-attention bench's cells)."""
    fns = {name: attention_fn(pattern, blocks) for name, pattern in PATTERNS.items()}
    return _linear.time_cells(fns, lengths, rounds, (B, N, H))


def report(results, lengths, blocks):
    block = blocks.block_q
    print(
        "| T | pattern | visited | fwd ms | fwd+bwd ms | causal/this fwd | causal/this fwd+bwd "
        "| fwd+bwd temp MiB |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for T in lengths:
        for name, pattern in PATTERNS.items():
            cell = {mode: results[T, name, mode] for mode in ("fwd", "fwd+bwd")}
            row = [str(T), name, f"{visited_fraction(T, pattern, min(block, T)):.2f}"]
            row += [f"{cell[mode]['time'] * 1e3:.1f}" for mode in cell]
            row += [
                f"{results[T, 'causal', mode]['time'] / cell[mode]['time']:.2f}x" for mode in cell
            ]
            row.append(f"{cell['fwd+bwd']['temp'] / 2**20:.1f}")
            print("| " + " | ".join(row) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=LENGTHS[-1], help="largest T to run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (T <= 2048)")
    parser.add_argument("--block", type=int, help="every block size (default: the kernel's)")
    args = parser.parse_args()
    blocks = blockwise.BlockSizes()
    if args.block:
        blocks = blockwise.BlockSizes(args.block, args.block, args.block, args.block)
    lengths = [T for T in LENGTHS if T <= args.max_len]
    if not lengths:
        parser.error(f"--max-len {args.max_len} is below the smallest length {LENGTHS[0]}")
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; B={B} N={N} H={H} fp32; "
        f"blocks fwd {blocks.block_q}x{blocks.block_k}, bwd "
        f"{blocks.backward().block_q}x{blocks.backward().block_k}"
    )
    start = time.perf_counter()
    report(bench(lengths, args.rounds, blocks), lengths, blocks)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
