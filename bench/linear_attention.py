"""Causal linear attention vs blockwise softmax attention: how time and memory grow with T.

    python bench/linear_attention.py                 # T = 512 .. 16384; ~3 minutes on 2 cores
    python bench/linear_attention.py --max-len 2048  # a quick run

Shapes: B=1, N=K=4, H=64, causal, float32. Implementations:

* ``softmax``: ``tfmjax.kernels.attention(..., impl="blockwise", causal=True)`` (exact,
  FlashAttention-style, O(T^2) time, O(T) memory), default block sizes;
* ``elu``: :func:`tfmjax.kernels.linear.linear_attention` with ``elu(x) + 1`` features
  (Katharopoulos et al. 2020; F = H = 64);
* ``favor64``, ``favor256``: the same with FAVOR+ random features (Choromanski et al.
  2021), F = 64 (as wide as ``elu``: the difference is the cost of the features) and
  F = 256 (about ``H log H``, the Performer paper's choice), fixed projection key.

Linear attention uses its default ``chunk_size=64`` (the fastest of 32..256 at T=4096).

Each (T, implementation, mode) is compiled first, then timed in interleaved rounds (every
cell once per round, so load from other processes hits all alike); the table shows
medians. Modes: ``fwd`` (the output) and ``fwd+bwd`` (``jit(grad(sum(out)))`` wrt q, k,
v). Memory: XLA's temp buffers of the compiled executable
(``compiled.memory_analysis().temp_size_in_bytes``; inputs and outputs excluded).
``softmax/this``: softmax time over this implementation's (> 1: linear is faster);
``growth``: this T's time over the previous T's (ideal per doubling: 2 for linear, 4 for
quadratic).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfmjax import kernels  # noqa: E402
from tfmjax.kernels import linear  # noqa: E402

B, N, H = 1, 4, 64
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)


def _implementations():
    projections = {F: linear.favor_projection(jax.random.key(0), F, H) for F in (64, 256)}

    def favor(F):
        return lambda q, k, v: linear.linear_attention(
            q, k, v, causal=True, feature_map="favor", projection=projections[F]
        )

    return {
        "softmax": lambda q, k, v: kernels.attention(q, k, v, causal=True, impl="blockwise"),
        "elu": lambda q, k, v: linear.linear_attention(q, k, v, causal=True),
        "favor64": favor(64),
        "favor256": favor(256),
    }


def _fwd_bwd(fn):
    return jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2))


def _timed(fn, *args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def rounds_for(T, rounds):
    """Fewer repeats at large T: ``rounds`` up to 2048, then about halved per 4x."""
    return max(2, rounds // (1 + (T > 2048) + (T > 8192)))


def time_cells(fns: dict, lengths, rounds, shape=(B, N, H)) -> dict:
    """``{(T, name, mode): {"time", "temp", "compile_s"}}`` of each ``name -> fn(q, k, v)``
    of ``fns`` on ``[B,T,N,H]`` normal inputs (``shape = (B, N, H)``), ``mode`` ``fwd``
    and ``fwd+bwd``: each cell compiled and warmed up first, then timed in interleaved
    rounds (every cell once per round, so load from other processes hits all alike;
    medians). ``temp``: XLA's temp
    buffers of the compiled executable. Shared by the attention benches of this folder."""
    results = {}
    for T in lengths:
        q, k, v = (
            jax.random.normal(key, (shape[0], T, *shape[1:]), jnp.float32)
            for key in jax.random.split(jax.random.key(T), 3)
        )
        cells = {}
        for name, fn in fns.items():
            for mode, f in (("fwd", fn), ("fwd+bwd", _fwd_bwd(fn))):
                start = time.perf_counter()
                compiled = jax.jit(f).trace(q, k, v).lower().compile()
                compile_s = time.perf_counter() - start
                _timed(compiled, q, k, v)  # warm-up
                temp = compiled.memory_analysis().temp_size_in_bytes
                cells[name, mode] = dict(compiled=compiled, times=[], temp=temp, c=compile_s)
        n = rounds_for(T, rounds)
        for _ in range(n):  # interleaved rounds
            for cell in cells.values():
                cell["times"].append(_timed(cell["compiled"], q, k, v))
        for (name, mode), cell in cells.items():
            results[T, name, mode] = dict(
                time=statistics.median(cell["times"]), temp=cell["temp"], compile_s=cell["c"]
            )
        compile_s = sum(cell["c"] for cell in cells.values())
        print(f"T={T}: {n} rounds, compile {compile_s:.1f} s", file=sys.stderr, flush=True)
    return results


def bench(lengths, rounds):
    impls = _implementations()
    return time_cells(impls, lengths, rounds), list(impls)


def report(results, lengths, names):
    print(
        "| T | impl | fwd ms | fwd+bwd ms | softmax/this fwd | softmax/this fwd+bwd "
        "| fwd growth | fwd+bwd growth | fwd temp MiB | fwd+bwd temp MiB |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, T in enumerate(lengths):
        for name in names:
            row = [str(T), name]
            cell = {mode: results[T, name, mode] for mode in ("fwd", "fwd+bwd")}
            row += [f"{cell[mode]['time'] * 1e3:.1f}" for mode in cell]
            row += [
                f"{results[T, 'softmax', mode]['time'] / cell[mode]['time']:.2f}x" for mode in cell
            ]
            for mode in cell:
                prev = results.get((lengths[i - 1], name, mode)) if i else None
                row.append(f"{cell[mode]['time'] / prev['time']:.2f}x" if prev else "")
            row += [f"{cell[mode]['temp'] / 2**20:.1f}" for mode in cell]
            print("| " + " | ".join(row) + " |")
    for name in names[1:]:
        for mode in ("fwd", "fwd+bwd"):
            faster = [
                T
                for T in lengths
                if results[T, name, mode]["time"] < results[T, "softmax", mode]["time"]
            ]
            print(
                f"{name} {mode}: faster than softmax at T={', '.join(map(str, faster))}"
                if faster
                else f"{name} {mode}: never faster than softmax up to T={lengths[-1]}"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=LENGTHS[-1], help="largest T to run")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (T <= 2048)")
    args = parser.parse_args()
    lengths = [T for T in LENGTHS if T <= args.max_len]
    if not lengths:
        parser.error(f"--max-len {args.max_len} is below the smallest length {LENGTHS[0]}")
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; B={B} N={N} H={H} causal fp32; "
        f"rounds {', '.join(f'{rounds_for(T, args.rounds)} at T={T}' for T in lengths)}"
    )
    start = time.perf_counter()
    results, names = bench(lengths, args.rounds)
    report(results, lengths, names)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
