"""Wall time of a seed sweep with the process pool against the same runs one after another;
with ``--stacked``, the per-run step cost of the one-program executor instead.

``python bench/sweep.py [--config configs/reverse.toml] [--seeds 3] [key=value ...]``: the
runs ``train.seed = 0 .. seeds-1`` of the config, first as ``python -m tfmjax.sweep`` (one
pinned process per core), then as ``train.py`` runs one after another, each in fresh
workdirs under a temporary directory; prints both wall times (Python start-up, compile,
training, evals and saves included), their ratio and the load average around each.

``python bench/sweep.py --stacked 1,4,16 [key=value ...]``: the plain jitted call of
``train.steps_per_call`` steps against the vmapped one of R runs (``tfmjax.train.stacked``),
median of a few calls after a warm-up, per run and step: R seeds (the numbers Python
constants, the plain step's arithmetic), and R runs of a grid that also differ in learning
rate, dropout rate and label smoothing (per-run arrays: every run draws dropout masks and
computes the smoothing term, even those at 0).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str]) -> tuple[float, float, float]:
    """``(wall seconds, load before, load after)`` of one command; exits if it fails."""
    before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stdout[-1000:]}{proc.stderr[-2000:]}")
    return wall, before, os.getloadavg()[0]


def _median_call(fn, state, batches, calls: int, *extra) -> float:
    import jax

    times = []
    for _ in range(calls + 1):  # the first compiles
        begin = time.perf_counter()
        state, _ = fn(state, batches, *extra)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - begin)
    return sorted(times[1:])[len(times[1:]) // 2]


def _grid(r: int) -> dict:
    """Per-run learning rates, dropout rates and label smoothings of R runs (0 included)."""
    import jax.numpy as jnp

    share = jnp.arange(r, dtype=jnp.float32) / max(r, 2)
    return {
        "optim.learning_rate": 1e-3 * (1.0 + share),
        "optim.label_smoothing": 0.2 * share,
        "model.dropout_rate": 0.2 * share,
    }


def stacked(config: str, overrides: list[str], sizes: list[int], calls: int = 5) -> None:
    """Per-run step cost of the vmapped call of R runs against the plain call of one."""
    import jax
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from tfmjax.config import load
    from tfmjax.train.run import build_run
    from tfmjax.train.stacked import _stack, _vmapped_steps
    from tfmjax.train.state import create_state

    exp = load(ROOT / config, overrides)
    run, k = build_run(exp), exp.train.steps_per_call_on(jax.default_backend())
    sample = run.batch(0)
    batch = {key: np.stack([run.batch(s)[key] for s in range(k)]) for key in sample}
    one = create_state(run.model, run.tx, sample, 0)
    plain = _median_call(run.train_steps, one, run.device_batches(0, k), calls)
    print(f"{config} {' '.join(overrides)}: {k} step(s) a call, {jax.default_backend()}")
    print(f"{'runs':>5} {'differ in':>16} {'call ms':>9} {'per run-step ms':>16} {'vs plain':>9}")
    print(f"{'plain':>5} {'':>16} {plain * 1e3:>9.1f} {plain / k * 1e3:>16.2f} {1.0:>9.2f}")
    for r in sizes:
        batches = {key: np.stack([value] * r) for key, value in batch.items()}
        for name, hyper in [("seed", {}), ("seed,lr,drop,ls", _grid(r))]:
            states = _stack([create_state(run.model, run.tx, sample, s) for s in range(r)])
            fn = _vmapped_steps(exp, tuple(hyper))
            took = _median_call(fn, states, batches, calls, hyper)
            per = took / (k * r)
            row = f"{r:>5} {name:>16} {took * 1e3:>9.1f} {per * 1e3:>16.2f}"
            print(f"{row} {per / (plain / k):>9.2f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/reverse.toml")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--stacked", help="run counts, e.g. 1,4,16: the one-program step cost")
    p.add_argument("overrides", nargs="*", help="section.key=value for every run")
    args = p.parse_args(argv)
    if args.stacked:
        stacked(args.config, args.overrides, [int(r) for r in args.stacked.split(",")])
        return 0
    seeds = list(range(args.seeds))
    with tempfile.TemporaryDirectory() as tmp:
        sweep = [sys.executable, "-m", "tfmjax.sweep", args.config, *args.overrides]
        sweep += ["--seeds", ",".join(map(str, seeds)), "--workdir", f"{tmp}/sweep"]
        pool = timed(sweep)
        one_by_one = [0.0, os.getloadavg()[0], 0.0]
        for seed in seeds:
            run = [sys.executable, "train.py", args.config, *args.overrides]
            wall, _, after = timed([*run, f"train.seed={seed}", f"train.workdir={tmp}/{seed}"])
            one_by_one[0] += wall
            one_by_one[2] = after
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{args.seeds} seeds of {args.config} {' '.join(args.overrides)}; {cores} cores")
    print(f"{'how':<30} {'wall s':>8} {'load before':>12} {'load after':>11}")
    for name, (wall, before, after) in [
        ("python -m tfmjax.sweep (pool)", pool),
        ("train.py one after another", one_by_one),
    ]:
        print(f"{name:<30} {wall:>8.1f} {before:>12.2f} {after:>11.2f}")
    print(f"pool / one after another: {pool[0] / one_by_one[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
