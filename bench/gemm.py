"""The dense matmuls of one training step, XLA:CPU's ``dot_general`` against torch's GEMM.

    python bench/gemm.py [--config configs/shakespeare_char.toml] [--rounds 9]

Is a small model's step slower than PyTorch's because of the GEMM kernels or because of
the ops around them? This times each matmul of the config's decoder-only step alone, in its
three forms: the forward ``x [M,K] @ w [K,N]`` (``M`` = batch * context), the input
gradient ``g [M,N] @ w^T`` and the weight gradient ``x^T @ g`` (a contraction over the rows,
as the folded dense layers of ``tfmjax.layers.folded_dot`` compute it), for the attention
projections (``D -> N*H`` and back), the feed-forward (``D -> F -> D``) and the tied logits
(``D -> V``). Each form is one jitted ``lax.dot_general`` (float32) and one torch ``mm``
on the same arrays; the two are timed in turn, ``--rounds`` rounds of a batch of calls each,
and the ratio is the median over the rounds of torch time / XLA time (above 1: XLA faster).
The last lines weigh each form by how often a step runs it, giving the step's matmul
milliseconds in each library: compare them with the step times of ``bench/train.py``.
torch runs at the thread count it picks fastest for the first shape (1 or all cores;
``bench/torch_twins.set_fastest_threads``).
Needs torch (``pip install 'tfmjax[bench]'``).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from tfmjax.config import load  # noqa: E402
from tfmjax.train.run import build_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "bench_torch_twins", Path(__file__).with_name("torch_twins.py")
)
torch_twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_twins)  # its thread-count trial

# lax.dot_general dimension numbers of the three forms, and the same product in torch
FORMS = {
    "forward": ((((1,), (0,)), ((), ())), lambda a, b: a @ b),  # x @ w
    "input grad": ((((1,), (1,)), ((), ())), lambda a, b: a @ b.t()),  # g @ w^T
    "weight grad": ((((0,), (0,)), ((), ())), lambda a, b: a.t() @ b),  # x^T @ g
}


def step_matmuls(path: Path) -> tuple[int, list[tuple[str, int, int, int]]]:
    """``(M, [(name, K, N, count a step)])``: the dense layers of a decoder-only config
    (softmax attention, dense feed-forwards; others are refused in one line)."""
    experiment = load(path)
    m = experiment.model
    if m.family != "decoder_only" or m.attention != "softmax" or m.moe_experts:
        raise SystemExit(
            f"{path}: bench/gemm.py reads decoder-only configs with softmax attention and dense "
            f"feed-forwards (got {m.family}, attention {m.attention}, {m.moe_experts} experts)"
        )
    rows = build_run(experiment).batch(0)["tokens"].size  # batch * context
    heads, kv = m.num_heads * m.head_width, m.kv_heads * m.head_width
    up = 2 if m.activation == "swiglu" else 1
    layers = [
        ("query", m.d_model, heads, m.num_layers),
        ("key, value", m.d_model, kv, 2 * m.num_layers),
        ("attention out", heads, m.d_model, m.num_layers),
        ("ffn up", m.d_model, m.d_ff, up * m.num_layers),
        ("ffn down", m.d_ff, m.d_model, m.num_layers),
        ("logits", m.d_model, m.vocab_size, 1),
    ]
    return rows, layers


def operands(form: str, m: int, k: int, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    return {"forward": (x, w), "input grad": (g, w), "weight grad": (x, g)}[form]


def paired_seconds(xla_call, torch_call, rounds: int, calls: int) -> tuple[float, float, float]:
    """Median seconds a call of each, and the median per-round ratio torch / XLA."""
    xla_call().block_until_ready()
    torch_call()
    xla_times, torch_times = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = xla_call()
        out.block_until_ready()
        xla_times.append((time.perf_counter() - start) / calls)
        start = time.perf_counter()
        for _ in range(calls):
            torch_call()
        torch_times.append((time.perf_counter() - start) / calls)
    ratio = statistics.median(t / x for t, x in zip(torch_times, xla_times, strict=True))
    return statistics.median(xla_times), statistics.median(torch_times), ratio


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "shakespeare_char.toml")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=100, help="calls per round and library")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench/gemm.py needs torch: pip install 'tfmjax[bench]'")
        return 1
    rows, layers = step_matmuls(args.config)
    rng = np.random.default_rng(0)
    a, b = operands("forward", rows, layers[0][1], layers[0][2], rng)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)

    def products(n: int) -> None:
        for _ in range(n):
            ta @ tb

    threads = torch_twins.set_fastest_threads(products, warm=1, timed=50)
    print(
        f"{args.config.name}: M = {rows} rows, float32; jax {jax.__version__} "
        f"({jax.devices()[0].platform}), torch {torch.__version__} ({threads} thread(s)); "
        f"{args.rounds} rounds of {args.calls} calls"
    )
    print(f"{'matmul':14} {'form':12} {'M x K x N':>16} {'xla us':>8} {'torch us':>8} "
          f"{'xla GF/s':>8} {'torch/xla':>9}")  # fmt: skip
    step_xla = step_torch = 0.0
    for name, k, n, count in layers:
        for form, (dims, torch_product) in FORMS.items():
            lhs, rhs = operands(form, rows, k, n, rng)
            dot = jax.jit(lambda p, q, dims=dims: lax.dot_general(p, q, dims))
            jl, jr = jax.device_put(lhs), jax.device_put(rhs)
            tl, tr = torch.from_numpy(lhs), torch.from_numpy(rhs)
            xla_s, torch_s, ratio = paired_seconds(
                functools.partial(dot, jl, jr),
                functools.partial(torch_product, tl, tr),
                args.rounds,
                args.calls,
            )
            step_xla += count * xla_s
            step_torch += count * torch_s
            shape = f"{rows}x{k}x{n}"
            gflops = 2 * rows * k * n / xla_s / 1e9
            print(f"{name:14} {form:12} {shape:>16} {xla_s * 1e6:8.0f} {torch_s * 1e6:8.0f} "
                  f"{gflops:8.1f} {ratio:8.2f}x")  # fmt: skip
    print(
        f"a step's matmuls (each form times its count): xla {step_xla * 1e3:.1f} ms, "
        f"torch {step_torch * 1e3:.1f} ms, torch/xla {step_torch / step_xla:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
