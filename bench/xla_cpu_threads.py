"""Does XLA:CPU spread a small model's matmuls over the cores? Each dot library, one core
against all, beside torch at one thread and at all.

    python bench/xla_cpu_threads.py [--config configs/shakespeare_char.toml] [--rounds 7]

Every distinct matmul of the config's step (the shapes of ``bench/gemm.py``: forward, input
gradient and weight gradient of each dense layer, float32) is timed as one jitted
``lax.dot_general`` in a fresh process per setting: XLA:CPU's default dot library (YNNPACK
fusions in jax 0.10), oneDNN fusions, and XLA's own Eigen dot, each on every core and pinned
to one core (``os.sched_setaffinity`` before jax starts). The speed-up of all cores over
one says whether the library splits the matmul over threads. Then ``--chains`` independent
``tanh(x @ w)`` against the same ops chained, on all cores and on one: whether XLA runs
independent ops at the same time. torch's ``mm`` at 1 thread and at all cores comes last
when torch is installed (``pip install 'tfmjax[bench]'``). docs/cpu_speed.md has the figures.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = {  # XLA_FLAGS of each dot library (jax 0.10's option names)
    "ynnpack (default)": "",
    "onednn": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true "
    "--xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "eigen": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_xnn_fusion_type= "
    "--xla_cpu_use_xnnpack=false",
}


@functools.cache
def load_gemm():
    spec = importlib.util.spec_from_file_location("bench_gemm", Path(__file__).with_name("gemm.py"))
    gemm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gemm)
    return gemm


def shapes(config: Path) -> list[tuple[str, int, int, int]]:
    """``[(form, M, K, N)]``: each distinct matmul of the config's step, once."""
    gemm = load_gemm()
    rows, layers = gemm.step_matmuls(config)
    seen = []
    for _, k, n, _ in layers:
        for form in gemm.FORMS:
            if (form, rows, k, n) not in seen:
                seen.append((form, rows, k, n))
    return seen


def median_seconds(call, rounds: int, calls: int, wait=lambda out: out) -> float:
    wait(call())
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = call()
        wait(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def child(args) -> None:
    """Runs in a fresh process (XLA_FLAGS and affinity set): prints the seconds as JSON."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    gemm = load_gemm()
    rng = np.random.default_rng(0)
    ready = lambda out: jax.block_until_ready(out)  # noqa: E731
    seconds = {}
    for form, m, k, n in shapes(args.config):
        lhs, rhs = (jax.device_put(x) for x in gemm.operands(form, m, k, n, rng))
        dot = jax.jit(lambda p, q, dims=gemm.FORMS[form][0]: lax.dot_general(p, q, dims))
        seconds[f"{form} {m}x{k}x{n}"] = median_seconds(
            lambda dot=dot, p=lhs, q=rhs: dot(p, q), args.rounds, args.calls, ready
        )
    m, k, n = shapes(args.config)[0][1:]
    xs = [jnp.asarray(rng.standard_normal((m, k)), jnp.float32) for _ in range(args.chains)]
    ws = [jnp.asarray(rng.standard_normal((k, n)), jnp.float32) for _ in range(args.chains)]

    def chained(xs, ws):
        x = xs[0]
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    independent = jax.jit(lambda xs, ws: [jnp.tanh(x @ w) for x, w in zip(xs, ws, strict=True)])
    calls = max(1, args.calls // args.chains)
    for name, fn in (("independent", independent), ("chained", jax.jit(chained))):
        seconds[f"{args.chains} {name} tanh(x @ w)"] = median_seconds(
            lambda fn=fn: fn(xs, ws), args.rounds, calls, ready
        )
    print(json.dumps(seconds))


def run_child(args, flags: str, one_core: bool) -> dict:
    flags = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")  # XLA:CPU even beside a GPU
    cmd = [sys.executable, __file__, "--child", "--config", str(args.config)]
    cmd += ["--rounds", str(args.rounds), "--calls", str(args.calls), "--chains", str(args.chains)]
    cores = {min(os.sched_getaffinity(0))} if one_core else None
    done = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
    )
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def torch_seconds(args) -> dict:
    try:
        import torch
    except ImportError:
        return {}
    gemm = load_gemm()
    rng = np.random.default_rng(0)
    results = {}
    for threads in (1, len(os.sched_getaffinity(0))):
        torch.set_num_threads(threads)
        for form, m, k, n in shapes(args.config):
            lhs, rhs = (torch.from_numpy(x) for x in gemm.operands(form, m, k, n, rng))
            product = gemm.FORMS[form][1]
            results.setdefault(f"{form} {m}x{k}x{n}", {})[threads] = median_seconds(
                lambda p=lhs, q=rhs, f=product: f(p, q), args.rounds, args.calls
            )
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "shakespeare_char.toml")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--chains", type=int, default=12, help="independent ops in the probe")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    cores = len(os.sched_getaffinity(0))
    print(f"{args.config.name}: each matmul alone, median of {args.rounds} rounds; "
          f"us on {cores} cores / on 1 core (speed-up of {cores} cores over 1)")  # fmt: skip
    table = {}
    for library, flags in LIBRARIES.items():
        both, one = run_child(args, flags, False), run_child(args, flags, True)
        if "error" in both or "error" in one:
            print(f"{library}: not run here ({both.get('error') or one.get('error')})")
            continue
        table[library] = {key: (both[key], one[key]) for key in both}
    torch_times = torch_seconds(args)
    keys = next(iter(table.values())).keys() if table else []
    header = f"{'matmul':34}" + "".join(f"{name:>26}" for name in table)
    header += f"{'torch ' + str(cores) + ' / 1 thread':>26}" if torch_times else ""
    print(header)
    for key in keys:
        line = f"{key:34}"
        for results in table.values():
            both, one = results[key]
            line += f"{both * 1e6:>10.0f} / {one * 1e6:>5.0f} ({one / both:4.2f}x)"
        if key in torch_times:
            t_one, t_all = torch_times[key][1], torch_times[key][cores]
            line += f"{t_all * 1e6:>10.0f} / {t_one * 1e6:>5.0f} ({t_one / t_all:4.2f}x)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
