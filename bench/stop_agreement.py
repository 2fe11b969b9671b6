"""The cost of agreeing on a stop after every step, with two processes on this machine.

    python bench/stop_agreement.py                    # configs/reverse.toml, data=2
    python bench/stop_agreement.py --config configs/shakespeare_char.toml

Two processes (one CPU device each) join JAX's distributed runtime on localhost and build
the run of ``--config`` on mesh data=2, as ``train.py`` does. Each then times, side by side
in the same run: ``--steps`` train steps alone (each waited for), the same steps each
followed by the stop agreement (``tfmjax.train.stopping.agreed_stop``: one all-gather of an
int over the processes), and the agreement alone. Process 0 prints the per-step figures and
the agreement's share of a step.
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
    from tfmjax.train.run import build_run
    from tfmjax.train.state import create_state
    from tfmjax.train.stopping import StopSignals, agreed_stop

    experiment = load(args.config, ["mesh.data=2", "train.steps=100000"])
    run = build_run(experiment)
    state = create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings)
    batches = [run.device_batch(s) for s in range(4)]

    def steps(n: int, agree: bool) -> float:
        nonlocal state
        begin = time.perf_counter()
        for i in range(n):
            state, _ = run.train_step(state, batches[i % 4])
            jax.block_until_ready(state)
            if agree:
                agreed_stop(stop)
        return (time.perf_counter() - begin) / n

    with StopSignals() as stop:
        steps(5, True)  # compile, warm up
        plain, agreeing = [], []
        for _ in range(args.rounds):  # interleaved, so drift hits both alike
            plain.append(steps(args.steps, False))
            agreeing.append(steps(args.steps, True))
        begin = time.perf_counter()
        for _ in range(args.steps):
            agreed_stop(stop)
        alone = (time.perf_counter() - begin) / args.steps
    if jax.process_index() == 0:
        step, with_stop = min(plain), min(agreeing)
        print(f"config {args.config}, mesh data=2 over 2 processes x 1 cpu device")
        print(f"train step alone:               {step * 1e3:8.3f} ms")
        print(f"train step + agreement:         {with_stop * 1e3:8.3f} ms")
        print(f"agreement alone:                {alone * 1e3:8.3f} ms")
        print(f"agreement / step (alone):       {alone / step:8.2%}")
        print(f"step + agreement / step:        {with_stop / step:8.3f}x")


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
