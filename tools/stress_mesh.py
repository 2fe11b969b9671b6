"""Stress training on several CPU devices: every family, 2 and 8 host devices, meshes data=2,
fsdp=2 and data=2 x fsdp=2 x tensor=2, tied and untied embeddings, evals and checkpoints
on, while another process keeps the cores busy. Not a CI test: it takes hours at full count.

    python tools/stress_mesh.py                       # 20 repeats of every case
    python tools/stress_mesh.py --repeats 3 --steps 100 --only reverse_decoder
    python tools/stress_mesh.py --report              # the table of what is stored

Each run's outcome (exit code, seconds, the last stderr line) is appended to
``experiments/results/stress_mesh.jsonl``; a rerun does only the runs still missing, so the
sweep can span sittings. A run passes when ``train.py`` exits 0 within ``--timeout``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "stress_mesh.jsonl"
# one config per family; the language models are the shapes users try a mesh with first
CONFIGS = {
    "reverse": "configs/reverse.toml",  # encoder-decoder
    "reverse_decoder": "configs/reverse_decoder.toml",  # decoder-only
    "shakespeare_char": "configs/shakespeare_char.toml",  # decoder-only language model
    "shakespeare_mlm": "configs/shakespeare_mlm.toml",  # encoder-only
}
MESHES = {  # devices -> mesh overrides
    2: [("mesh.data=2",), ("mesh.fsdp=2",)],
    8: [("mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2")],
}
LOAD = "while True: pass"  # the busy process beside every run


def cases(only: list[str] | None):
    for name, devices, tied in itertools.product(CONFIGS, MESHES, (True, False)):
        if only and name not in only:
            continue
        for mesh in MESHES[devices]:
            yield {"config": name, "devices": devices, "mesh": list(mesh), "tied": tied}


def case_key(case: dict) -> str:
    tied = "tied" if case["tied"] else "untied"
    return f"{case['config']} {case['devices']}dev {' '.join(case['mesh'])} {tied}"


def stored() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            record = json.loads(line)
            out.setdefault(record["case"], []).append(record)
    return out


def run_once(case: dict, steps: int, timeout: float) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={case['devices']}")
    env["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as workdir:
        every = max(steps // 2, 1)
        cmd = [
            sys.executable,
            "train.py",
            CONFIGS[case["config"]],
            *case["mesh"],
            f"model.tie_embeddings={'true' if case['tied'] else 'false'}",
            f"train.steps={steps}",
            f"train.eval_every={every}",
            f"train.checkpoint_every={every}",
            f"train.log_every={every}",
            "optim.warmup_steps=10",
            "data.eval_examples=32",
            f"train.workdir={workdir}",
            "--progress=lines",
        ]
        begin = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
            )
            code, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, err = "timeout", (exc.stderr or b"").decode(errors="replace")
    lines = [line for line in err.splitlines() if line.strip()]
    return {
        "case": case_key(case),
        **case,
        "steps": steps,
        "exit": code,
        "seconds": round(time.monotonic() - begin, 1),
        "last_stderr": lines[-1][:300] if lines else "",
    }


def report() -> str:
    rows = [f"{'case':<66} runs  passed"]
    for key, records in sorted(stored().items()):
        passed = sum(r["exit"] == 0 for r in records)
        rows.append(f"{key:<66} {len(records):>4}  {passed:>6}")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS))
    parser.add_argument("--no-load", action="store_true", help="no busy process beside runs")
    parser.add_argument("--report", action="store_true", help="print the stored table only")
    args = parser.parse_args(argv)
    if args.report:
        print(report())
        return 0
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    done = stored()
    load = None if args.no_load else subprocess.Popen([sys.executable, "-c", LOAD])
    try:
        for case in cases(args.only):
            missing = args.repeats - len(done.get(case_key(case), []))
            for _ in range(max(missing, 0)):
                record = run_once(case, args.steps, args.timeout)
                with RESULTS.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(
                    f"{record['case']}: exit {record['exit']} in {record['seconds']} s", flush=True
                )
    finally:
        if load is not None:
            load.kill()
    print(report())
    failed = [r for records in stored().values() for r in records if r["exit"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
