"""Attention implementations side by side, in one process: time, useful GFLOP/s, memory.

    python bench/attention.py            # T in {512, 2048, 8192}; a few minutes on 2 cores
    python bench/attention.py --quick    # T in {128, 256}: a smoke run in seconds

Shapes: B=1, N=K=8, H=64, causal, float32. Every implementation is compiled first
(compile times are printed apart), then timed in interleaved rounds (median per cell), so
load from other processes hits all of them alike. A 2048x2048 float32 ``jnp.dot`` is
timed in the same rounds to give the machine's matmul rate.

FLOP convention ("useful" FLOPs: the causal half of the score matrix only):
forward = 2 matmuls (QK^T, PV) x 2*B*N*T*S*H FLOPs x 1/2 (causal) = 2*B*N*T*S*H;
forward+backward = 3.5 x forward (FlashAttention-2: the backward is 5 matmuls, or 2.5
forwards). Memory: XLA's temp buffers of the compiled executable
(``compiled.memory_analysis().temp_size_in_bytes``), inputs and outputs excluded.

Implementations: ``reference`` (materialised softmax(QK^T/sqrt(H) + mask) V), ``jax.nn`` (
``jax.nn.dot_product_attention``, XLA), ``xla`` and ``blockwise`` from tfmjax.kernels, and
``pallas`` in interpret mode (an emulation of the GPU/TPU kernel, far too slow on CPU
beyond T=512; shown for scale only). ``blockwise-full`` is blockwise without the causal
mask: causal / full time checks that causal block skipping saves work (ideal ~ 0.5).
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

from tfmjax.kernels import blockwise, pallas_attention, reference, xla  # noqa: E402

B, N, H = 1, 8, 64
PALLAS_MAX_T = 512


def _kernel(module, causal=True):
    def fn(q, k, v):
        return module.attention(
            q,
            k,
            v,
            causal=causal,
            q_segment_ids=None,
            kv_segment_ids=None,
            window=None,
            alibi_slopes=None,
            bias=None,
            q_offset=0,
            scale=H**-0.5,
        )

    return fn


IMPLS = {
    "reference": _kernel(reference),
    "jax.nn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True),
    "xla": _kernel(xla),
    "blockwise": _kernel(blockwise),
    "pallas": _kernel(pallas_attention),
    "blockwise-full": _kernel(blockwise, causal=False),
}


def _fwd_bwd(fn):
    def run(q, k, v, d_out):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(d_out)

    return run


def _timed(fn, *args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _compile(fn, *args):
    start = time.perf_counter()
    compiled = jax.jit(fn).trace(*args).lower().compile()
    return compiled, time.perf_counter() - start


def bench(lengths, rounds, slow_s):
    x = jnp.ones((2048, 2048), jnp.float32)
    matmul, _ = _compile(jnp.dot, x, x)
    matmul_times = []
    for T in lengths:
        keys = jax.random.split(jax.random.key(T), 4)
        q, k, v, d_out = (jax.random.normal(key, (B, T, N, H), jnp.float32) for key in keys)
        cells = {}  # (impl, mode) -> dict(compiled, args, compile_s, temp, times)
        for name, fn in IMPLS.items():
            if name == "pallas" and T > PALLAS_MAX_T:
                continue
            for mode, f, args in (
                ("fwd", fn, (q, k, v)),
                ("fwd+bwd", _fwd_bwd(fn), (q, k, v, d_out)),
            ):
                if name == "blockwise-full" and mode != "fwd":
                    continue
                compiled, compile_s = _compile(f, *args)
                temp = compiled.memory_analysis().temp_size_in_bytes
                first = _timed(compiled, *args)  # warm-up
                single = first > slow_s  # too slow to repeat
                cells[name, mode] = dict(
                    compiled=compiled,
                    args=args,
                    compile_s=compile_s,
                    temp=temp,
                    times=[first] if single else [],
                    single=single,
                )
        for _ in range(rounds):  # interleaved rounds
            matmul_times.append(_timed(matmul, x, x))
            for cell in cells.values():
                if not cell["single"]:
                    cell["times"].append(_timed(cell["compiled"], *cell["args"]))
        report(T, cells, 2 * 2048**3 / statistics.median(matmul_times) / 1e9, slow_s)


def report(T, cells, matmul_gflops, slow_s):
    fwd_flops = 2 * B * N * T * T * H  # 2 matmuls x 2BNTSH x 1/2 (causal)
    print(
        f"\nT={T}  (B={B} N={N} H={H} causal fp32; same-run 2048^2 fp32 matmul: "
        f"{matmul_gflops:.0f} GFLOP/s)"
    )
    print(
        f"{'impl':15s} {'mode':8s} {'compile':>8s} {'time':>10s} {'GFLOP/s':>8s} "
        f"{'/matmul':>8s} {'vs ref':>8s} {'vs jax.nn':>9s} {'temp MiB':>10s}"
    )
    for (name, mode), cell in cells.items():
        t = statistics.median(cell["times"])
        gflops = fwd_flops * (1 if mode == "fwd" else 3.5) / t / 1e9
        ref = cells.get(("reference", mode))
        nn = cells.get(("jax.nn", mode))
        vs = lambda other, t=t: f"{statistics.median(other['times']) / t:.1f}x" if other else "n/a"
        star = "*" if cell["single"] else " "
        print(
            f"{name:15s} {mode:8s} {cell['compile_s']:7.1f}s {t * 1e3:9.1f}{star}"
            f" {gflops:8.1f} {gflops / matmul_gflops:8.2f} {vs(ref):>8s} {vs(nn):>9s}"
            f" {cell['temp'] / 2**20:10.1f}"
        )
    if T > PALLAS_MAX_T:
        print(
            f"{'pallas':15s} n/a: interpret mode (CPU emulation of the GPU/TPU kernel) is "
            f"only run for T <= {PALLAS_MAX_T}"
        )
    full, causal = cells.get(("blockwise-full", "fwd")), cells.get(("blockwise", "fwd"))
    if full and causal:
        n = -(-T // blockwise.BlockSizes().block_q)
        ratio = statistics.median(causal["times"]) / statistics.median(full["times"])
        print(
            f"block skipping: blockwise causal / non-causal fwd time = {ratio:.2f} "
            f"(block pairs visited: {(n + 1) / (2 * n):.2f} of all)"
        )
    if any(c["single"] for c in cells.values()):
        print(
            f"* a single run takes > {slow_s:.0f} s: timed once (its first run); "
            "every other cell: median of the rounds"
        )
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small T for a smoke run")
    parser.add_argument("--lengths", type=int, nargs="*", help="override the lengths")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument(
        "--slow",
        type=float,
        default=15.0,
        help="cells whose warm-up call takes longer are timed once",
    )
    args = parser.parse_args()
    lengths = args.lengths or ([128, 256] if args.quick else [512, 2048, 8192])
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind} "
        f"({jax.device_count()} device(s)), rounds={args.rounds}"
    )
    bench(lengths, args.rounds, args.slow)


if __name__ == "__main__":
    main()
