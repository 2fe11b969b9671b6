"""Nyström attention against exact softmax attention in an encoder (bidirectional): time and
memory at T = 1k to 16k.

    python bench/nystrom.py                  # T = 1024, 4096, 16384; minutes on 2 cores
    python bench/nystrom.py --max-len 4096   # a quicker run

Shapes: B=1, N=4, H=64, float32, no mask. Systems:

* ``softmax (xla)``: ``impl="reference"``, the dense ``[T,T]`` scores (what ``auto`` and
  ``xla`` run on a CPU, and what an encoder's softmax costs without a flash kernel);
* ``softmax (blockwise)``: the blockwise (flash) twin of the Pallas kernel, scores never
  whole: same values, memory ``O(T)``, time still ``O(T^2)``;
* ``nystrom M=64``: :func:`tfmjax.kernels.nystrom.nystrom_attention` with 64 landmarks (the
  paper's default) and 6 pseudo-inverse iterations: time and memory ``O(T M)``.

Each (T, system, mode) is compiled first, then timed in interleaved rounds (every cell once
per round, so load from other processes hits all alike); the table shows medians. Modes
``fwd`` and ``fwd+bwd`` (``jit(grad(sum(out)))`` wrt q, k, v). ``xla/this``: softmax
(xla)'s time over this system's (> 1: faster). Memory: XLA's temp buffers of the compiled
executable (inputs and outputs excluded). The error of the approximation is in
docs/nystrom.md; what it costs a trained model, in docs/studies.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from linear_attention import time_cells  # noqa: E402  (the loop of this folder's benches)

from tfmjax.kernels import blockwise, reference  # noqa: E402
from tfmjax.kernels.nystrom import nystrom_attention  # noqa: E402

B, N, H = 1, 4, 64
LENGTHS = (1024, 4096, 16384)
LANDMARKS = 64
SCALE = H**-0.5


def _softmax(impl):
    def fn(q, k, v):
        options = dict(causal=False, q_segment_ids=None, kv_segment_ids=None, window=None)
        options.update(alibi_slopes=None, bias=None, q_offset=0, scale=SCALE)
        return impl.attention(q, k, v, **options)

    return fn


SYSTEMS = {
    "softmax (xla)": _softmax(reference),
    "softmax (blockwise)": _softmax(blockwise),
    f"nystrom M={LANDMARKS}": lambda q, k, v: nystrom_attention(
        q, k, v, num_landmarks=LANDMARKS, scale=SCALE
    ),
}


def bench(lengths, rounds):
    """``{(T, system, mode): {"time", "temp", ...}}`` (the linear-attention bench's cells)."""
    return time_cells(SYSTEMS, lengths, rounds, (B, N, H))


def report(results, lengths) -> None:
    print(
        "| T | system | fwd ms | fwd+bwd ms | xla/this fwd | xla/this fwd+bwd | fwd+bwd temp MiB |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for T in lengths:
        for name in SYSTEMS:
            cell = {mode: results[T, name, mode] for mode in ("fwd", "fwd+bwd")}
            row = [str(T), name, *(f"{cell[m]['time'] * 1e3:.1f}" for m in cell)]
            base = {m: results[T, "softmax (xla)", m]["time"] for m in cell}
            row += [f"{base[m] / cell[m]['time']:.2f}x" for m in cell]
            row.append(f"{cell['fwd+bwd']['temp'] / 2**20:.1f}")
            print("| " + " | ".join(row) + " |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=LENGTHS[-1], help="largest T to run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (T <= 2048)")
    args = parser.parse_args(argv)
    lengths = [T for T in LENGTHS if T <= args.max_len]
    if not lengths:
        parser.error(f"--max-len {args.max_len} is below the smallest length {LENGTHS[0]}")
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; B={B} N={N} H={H} fp32")
    start = time.perf_counter()
    report(bench(lengths, args.rounds), lengths)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
