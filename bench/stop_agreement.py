"""The cost of agreeing on a stop after every step, with two processes on this machine.

    python bench/stop_agreement.py                    # configs/reverse.toml, data=2
    python bench/stop_agreement.py --config configs/shakespeare_char.toml

Two processes (one CPU device each) join JAX's distributed runtime on localhost and build
the run of ``--config`` on mesh data=2, as ``train.py`` does. Each then times, side by side
in the same run (rounds interleaved, the best round of each): ``--steps`` train steps alone
(each waited for), the same steps each followed by one all-gather of the stop flag (what
the loop did before), the same steps under :class:`tfmjax.train.stopping.StopAgreement`
(what it does now: a gather every few steps, keeping it under 1% of the time), and the
gather alone. Process 0 prints the per-step figures and the ratios.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worker(args) -> None:
    import jax

    jax.distributed.initialize(f"localhost:{args.port}", 2, args.process_id)
    from tfmjax.config import load
    from tfmjax.parallel.processes import any_process
    from tfmjax.train.run import build_run
    from tfmjax.train.state import create_state
    from tfmjax.train.stopping import StopAgreement, StopSignals

    experiment = load(args.config, ["mesh.data=2", "train.steps=100000"])
    run = build_run(experiment)
    state = create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings)
    batches = [run.device_batch(s) for s in range(4)]

    def steps(n: int, mode: str) -> float:
        nonlocal state
        agreement = StopAgreement(stop)
        begin = time.perf_counter()
        for i in range(n):
            state, _ = run.train_step(state, batches[i % 4])
            jax.block_until_ready(state)
            if mode == "every step":
                any_process(0)
            elif mode == "agreement":
                agreement.check(i + 1)
        return (time.perf_counter() - begin) / n

    modes = ("alone", "every step", "agreement")
    with StopSignals() as stop:
        steps(5, "every step")  # compile, warm up
        best = dict.fromkeys(modes, float("inf"))
        for _ in range(args.rounds):  # interleaved, so drift hits every mode alike
            for mode in modes:
                best[mode] = min(best[mode], steps(args.steps, mode))
        begin = time.perf_counter()
        for _ in range(args.steps):
            any_process(0)
        gather = (time.perf_counter() - begin) / args.steps
    if jax.process_index() == 0:
        step = best["alone"]
        print(f"config {args.config}, mesh data=2 over 2 processes x 1 cpu device")
        print(f"train step alone:                      {step * 1e3:8.3f} ms")
        print(f"  + a gather after every step:         {best['every step'] * 1e3:8.3f} ms")
        print(f"  + StopAgreement (every few steps):   {best['agreement'] * 1e3:8.3f} ms")
        print(f"one gather alone:                      {gather * 1e3:8.3f} ms")
        print(f"gather / step:                         {gather / step:8.2%}")
        print(f"every step / alone:                    {best['every step'] / step:8.3f}x")
        print(f"StopAgreement / alone:                 {best['agreement'] / step:8.3f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/reverse.toml")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.process_id is not None:
        _worker(args)
        return 0
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_NUM_CPU_DEVICES="1", JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                *(argv or sys.argv[1:]),
                f"--process-id={i}",
                f"--port={port}",
            ],
            cwd=ROOT,
            env=env,
        )
        for i in range(2)
    ]
    codes = [p.wait(timeout=1200) for p in procs]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
