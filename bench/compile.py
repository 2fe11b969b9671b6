"""Compile time and kernels of one train step: Optax's per-leaf clip + AdamW against the
fused optimizer (``tfmjax.train.fused_adamw``, what a one-device run uses), side by side.

    python bench/compile.py [--rounds 3] [--steps 20] [--only reverse_encdec ...]

For each shape of ``bench/train.py`` (default: reverse_encdec, the model and AdamW settings
of configs/reverse.toml, and shakespeare_char) and each optimizer, in rounds (the
optimizers alternating, a fresh jit each round): the seconds to trace and lower the step,
the seconds XLA compiles it (wall and this process's CPU time, the figure to trust on a
busy machine), the kernels it runs (the top-level instructions of the optimized module's
entry computation other than parameters, constants, tuples and bitcasts: one thunk each on
the CPU); then the milliseconds a step takes, the two compiled steps timed in ``--steps``
interleaved runs of 5 steps (medians). Ratios are optax / fused of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as bench_train  # noqa: E402  (bench/train.py: the shapes and their batches)
from tfmjax.models import build  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402
from tfmjax.train.step import make_train_step  # noqa: E402

OPTIMIZERS = ("optax", "fused")
NOT_KERNELS = ("parameter(", "constant(", "get-tuple-element(", "tuple(", "bitcast(")


def kernels(compiled) -> int:
    """Top-level instructions of the entry computation that run as kernels."""
    text = compiled.as_text()
    entry = text[text.index("\nENTRY") :].split("\n}\n")[0]
    lines = [line for line in entry.splitlines()[1:] if " = " in line]
    return sum(1 for line in lines if not any(k in line for k in NOT_KERNELS))


def measure(spec: dict, optimizer: str) -> tuple[dict, object, object, dict]:
    """``(figures, compiled step, state, batch)`` of one fresh trace and compile."""
    cfg, o = spec["config"], spec["optim"]
    batch = bench_train.random_batch(cfg, spec["batch"], spec["src"], spec["tgt"])
    tx = bench_train.optimizer(o, fused=optimizer == "fused")
    state = create_state(build(cfg), tx, batch, seed=0)
    step = make_train_step(build(cfg, deterministic=False), tx, lambda s: o.learning_rate)
    begin = time.perf_counter()
    lowered = jax.jit(step, donate_argnums=0).lower(state, batch)
    traced = time.perf_counter()
    cpu = time.process_time()
    compiled = lowered.compile()
    figures = {
        "trace_s": traced - begin,
        "compile_s": time.perf_counter() - traced,
        "compile_cpu_s": time.process_time() - cpu,
        "kernels": kernels(compiled),
    }
    return figures, compiled, state, batch


def step_times(steps: dict, states: dict, batches: dict, rounds: int, n: int) -> dict:
    """Milliseconds a step, per optimizer: medians of ``rounds`` interleaved runs of ``n``."""
    times = {k: [] for k in steps}
    for r in range(rounds):
        for name in list(steps)[r % 2 :] + list(steps)[: r % 2]:
            start = time.perf_counter()
            for _ in range(n):
                states[name], metrics = steps[name](states[name], batches[name])
            jax.block_until_ready(metrics)
            times[name].append((time.perf_counter() - start) / n * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=["reverse_encdec", "shakespeare_char"])
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {args.rounds} rounds")
    fields = ("trace_s", "compile_s", "compile_cpu_s", "kernels", "step_ms")
    header = f"{'shape':<18} {'optimizer':<9}" + "".join(f"{f:>15}" for f in fields)
    print(header)
    print("-" * len(header))
    for name in args.only:
        spec = bench_train.SHAPES[name]
        runs = {k: [] for k in OPTIMIZERS}
        steps, states, batches = {}, {}, {}
        for r in range(args.rounds):
            for optimizer in OPTIMIZERS[r % 2 :] + OPTIMIZERS[: r % 2]:
                figures, steps[optimizer], states[optimizer], batches[optimizer] = measure(
                    spec, optimizer
                )
                runs[optimizer].append(figures)
        med = {
            k: {f: statistics.median(m[f] for m in v) for f in fields[:-1]} for k, v in runs.items()
        }
        for optimizer, ms in step_times(steps, states, batches, args.steps, 5).items():
            med[optimizer]["step_ms"] = ms
        for optimizer in OPTIMIZERS:
            cells = "".join(f"{med[optimizer][f]:>15.3f}" for f in fields)
            print(f"{name:<18} {optimizer:<9}{cells}")
        ratio = "".join(f"{med['optax'][f] / med['fused'][f]:>14.2f}x" for f in fields)
        print(f"{name:<18} {'ratio':<9}{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
