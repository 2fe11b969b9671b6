"""Compile time and kernels of one train step: Optax's per-leaf clip + AdamW against the
fused optimizer (``tfmjax.train.fused_adamw``, what a one-device run uses), side by side.

    python bench/compile.py [--rounds 3] [--steps 20] [--only reverse_encdec ...]

For each shape of ``bench/train.py`` (default: reverse_encdec, the model and AdamW settings
of configs/reverse.toml, and shakespeare_char) and each optimizer, in rounds (the
optimizers alternating, a fresh jit each round): the seconds to trace and lower the step,
the seconds XLA compiles it (wall and this process's CPU time, the figure to trust on a
busy machine), the kernels it runs (the top-level instructions of the optimized module's
entry computation other than parameters, constants, tuples and bitcasts: one thunk each on
the CPU), and the milliseconds a step takes (median of ``--steps`` after the first). Ratios
are optax / fused of the medians over rounds.
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
from tfmjax.train.fused_adamw import FusedAdamW  # noqa: E402
from tfmjax.train.optimizer import make_optimizer  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402
from tfmjax.train.step import make_train_step  # noqa: E402

OPTIMIZERS = {"optax": make_optimizer, "fused": FusedAdamW}
NOT_KERNELS = ("parameter(", "constant(", "get-tuple-element(", "tuple(", "bitcast(")


def kernels(compiled) -> int:
    """Top-level instructions of the entry computation that run as kernels."""
    text = compiled.as_text()
    entry = text[text.index("\nENTRY") :].split("\n}\n")[0]
    lines = [line for line in entry.splitlines()[1:] if " = " in line]
    return sum(1 for line in lines if not any(k in line for k in NOT_KERNELS))


def measure(spec: dict, optimizer: str, steps: int) -> dict:
    cfg, o = spec["config"], spec["optim"]
    batch = bench_train.random_batch(cfg, spec["batch"], spec["src"], spec["tgt"])
    tx = OPTIMIZERS[optimizer](
        schedule=o.learning_rate,
        weight_decay=o.weight_decay,
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        clip_norm=o.clip_norm,
    )
    state = create_state(build(cfg), tx, batch, seed=0)
    step = make_train_step(build(cfg, deterministic=False), tx, lambda s: o.learning_rate)
    begin = time.perf_counter()
    lowered = jax.jit(step, donate_argnums=0).lower(state, batch)
    traced = time.perf_counter()
    cpu = time.process_time()
    compiled = lowered.compile()
    out = {
        "trace_s": traced - begin,
        "compile_s": time.perf_counter() - traced,
        "compile_cpu_s": time.process_time() - cpu,
        "kernels": kernels(compiled),
    }
    state, _ = compiled(state, batch)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    out["step_ms"] = statistics.median(times) * 1e3
    return out


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
        for r in range(args.rounds):
            order = list(OPTIMIZERS) if r % 2 == 0 else list(OPTIMIZERS)[::-1]
            for optimizer in order:
                runs[optimizer].append(measure(spec, optimizer, args.steps))
        med = {k: {f: statistics.median(m[f] for m in v) for f in fields} for k, v in runs.items()}
        for optimizer in OPTIMIZERS:
            cells = "".join(f"{med[optimizer][f]:>15.3f}" for f in fields)
            print(f"{name:<18} {optimizer:<9}{cells}")
        ratio = "".join(f"{med['optax'][f] / med['fused'][f]:>14.2f}x" for f in fields)
        print(f"{name:<18} {'ratio':<9}{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
