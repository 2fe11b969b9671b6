"""Wall time of a seed sweep with the process pool against the same runs one after another.

``python bench/sweep.py [--config configs/reverse.toml] [--seeds 3] [key=value ...]``: the
runs ``train.seed = 0 .. seeds-1`` of the config, first as ``python -m tfmjax.sweep`` (one
pinned process per core), then as ``train.py`` runs one after another, each in fresh
workdirs under a temporary directory; prints both wall times (Python start-up, compile,
training, evals and saves included), their ratio and the load average around each.
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/reverse.toml")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("overrides", nargs="*", help="section.key=value for every run")
    args = p.parse_args(argv)
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
