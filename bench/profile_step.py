"""Where a train step's time goes: a ``jax.profiler`` trace of a few steps, reduced to a table.

    python bench/profile_step.py                       # GPT-2 small, context 1024, batch 8, bf16
    python bench/profile_step.py --quick               # a tiny model on any platform (CI)
    python bench/profile_step.py --set model.vocab_multiple=128 --out DIR

The step is the training loop's own (``build_run(...).train_step``: jitted, state donated).
After ``--warm`` steps it traces ``--steps`` more (``jax.profiler.trace`` with a Perfetto
JSON trace) and reads the trace back: every kernel event on the device's streams (on a
CPU, XLA's thunks on the client threads), each named by its HLO instruction. Each
instruction is put in a group from its kind in the compiled HLO and the ``op_name`` of its
metadata (the JAX name stack: the Flax module path and the primitive):

  matmul       dots, GEMM custom calls and fusions whose root is a dot
  attention    the attention kernels (Pallas/Triton, cuDNN flash, ``attention`` in the path)
  softmax+CE   the head's log-softmax, the cross-entropy and their gradients
  norms        LayerNorm / RMSNorm and their gradients
  optimizer    the update (the clip, AdamW's moments, the parameter update)
  copies       copies, transposes, pads, slices, dynamic-update-slices
  other        everything else (elementwise fusions inside the layers: GELU, residual adds)
  idle         the span of the traced steps not covered by any kernel (per step: host
               launches, waits, gaps between kernels)

Writes ``profile.json`` (the table, the 40 longest instructions, each with its group and
op_name) and ``profile.md`` under ``--out``, and keeps the raw trace there when it is
under 40 MB. docs/gpu_speed.md holds the figures of a GPU run.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tfmjax.config import load  # noqa: E402
from tfmjax.train.run import build_run  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402

GPT2 = [
    "model.preset=gpt2-small",
    "data.task_params.context=1024",
    "data.batch_size=8",
    "model.dtype=bfloat16",
]
QUICK = [
    "model.num_layers=1",
    "model.d_model=32",
    "model.num_heads=2",
    "model.d_ff=64",
    "data.task_params.context=32",
    "data.batch_size=4",
]
GROUPS = ("matmul", "attention", "softmax+CE", "norms", "optimizer", "copies", "other")
# Checked in order: first the instruction itself (its kind, custom-call target and callee
# names), then the op_name of its metadata (the name stack: Flax module path and primitive;
# the train step names its ``loss`` and ``optimizer`` scopes).
KIND_RULES = (
    ("attention", re.compile(r"cudnn|fmha|flash|pallas|triton|mosaic", re.I)),
    ("matmul", re.compile(r"\bdot\b|dot_general|gemm|cublas|matmul|convolution", re.I)),
    ("copies", re.compile(r"^(copy|transpose|pad|slice|dynamic-update-slice|memcpy)", re.I)),
)
OP_NAME_RULES = (
    ("softmax+CE", re.compile(r"\bloss/|log_softmax|cross_entropy|/head/", re.I)),
    ("norms", re.compile(r"norm\b|norm/|layer_?norm|rms_?norm|ln_final", re.I)),
    ("optimizer", re.compile(r"\boptimizer/|adam|optax|apply_updates", re.I)),
    ("attention", re.compile(r"attention", re.I)),
    ("copies", re.compile(r"/(copy|transpose|pad|slice|dynamic_update_slice)$", re.I)),
)
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def instruction_texts(hlo: str) -> dict[str, str]:
    """``{instruction name: its line}`` of the compiled HLO (every computation)."""
    out = {}
    for line in hlo.splitlines():
        match = INSTRUCTION.match(line)
        if match:
            out[match.group(1)] = match.group(2)
    return out


def group_of(name: str, texts: dict[str, str]) -> str:
    """The group of kernel ``name`` (an HLO instruction name, or a kernel name) from its
    HLO line: the kind, custom-call target and callees first, then the op_name."""
    text = texts.get(name, "")
    head = text.split("metadata=")[0]
    kind = head.split("(")[0].split()[-1] if head.strip() else ""
    op_name = " ".join(OP_NAME.findall(text))
    for group, rule in KIND_RULES:
        if rule.search(kind) or rule.search(name) or (group != "copies" and rule.search(head)):
            return group
    for group, rule in OP_NAME_RULES:
        if rule.search(op_name):
            return group
    return "other"


def device_events(trace: dict, platform: str) -> list[dict]:
    """Complete events ('X') of the device's kernels. On a GPU/TPU, the device processes'
    "XLA Ops" lines (one event per HLO instruction) where the trace has them, else their
    stream lines (raw kernel names); on a CPU the XLA thunks on the PjRt client threads (not
    the profiler's own regions). The raw trace is kept beside the table to reduce again."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"
    }
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    line = lambda e: threads.get((e["pid"], e.get("tid")), "")  # noqa: E731
    if platform == "cpu":
        skip = re.compile(r"(end: |Thunk|Threadpool)")
        return [e for e in complete if "PjRtCpuClient" in line(e) and not skip.match(e["name"])]
    on_device = [e for e in complete if "/device:" in procs.get(e["pid"], "")]
    ops = [e for e in on_device if line(e) == "XLA Ops"]
    return ops or [e for e in on_device if "Stream" in line(e)]


def covered(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def reduce_trace(trace: dict, hlo: str, platform: str, steps: int, wall_us: float) -> dict:
    """The table: microseconds per step of each group, their share, idle time, and the
    longest instructions."""
    texts = instruction_texts(hlo)
    events = device_events(trace, platform)
    by_name = collections.defaultdict(float)
    for e in events:
        by_name[e["name"]] += e["dur"]
    groups = dict.fromkeys(GROUPS, 0.0)
    for name, dur in by_name.items():
        groups[group_of(name, texts)] += dur
    busy = covered([(e["ts"], e["ts"] + e["dur"]) for e in events])
    span = max(wall_us, busy)
    rows = {g: {"us_per_step": t / steps, "share": t / max(sum(groups.values()), 1e-9)}
            for g, t in groups.items()}  # fmt: skip
    rows["idle"] = {"us_per_step": (span - busy) / steps, "share_of_wall": 1 - busy / span}
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:40]
    return {
        "steps": steps,
        "wall_us_per_step": span / steps,
        "kernel_us_per_step": sum(groups.values()) / steps,
        "kernels": len(events),
        "groups": rows,
        "top": [
            {
                "name": name,
                "us_per_step": dur / steps,
                "group": group_of(name, texts),
                "op_name": " ".join(OP_NAME.findall(texts.get(name, "")))[:200],
            }
            for name, dur in top
        ],
    }


def markdown(table: dict, title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| group | us per step | share of kernel time |",
        "| --- | ---: | ---: |",
    ]
    for group in GROUPS:
        row = table["groups"][group]
        lines.append(f"| {group} | {row['us_per_step']:,.0f} | {row['share']:.1%} |")
    idle = table["groups"]["idle"]
    lines.append(f"| idle (of wall) | {idle['us_per_step']:,.0f} | {idle['share_of_wall']:.1%} |")
    lines += [
        "",
        f"wall {table['wall_us_per_step']:,.0f} us per step, {table['kernels']} kernels",
        "",
    ]
    lines += ["| instruction | us per step | group |", "| --- | ---: | --- |"]
    lines += [
        f"| `{t['name']}` | {t['us_per_step']:,.0f} | {t['group']} |" for t in table["top"][:15]
    ]
    return "\n".join(lines) + "\n"


def profile(overrides: list[str], warm: int, steps: int, out: Path) -> dict:
    experiment = load(ROOT / "configs" / "shakespeare_char.toml", overrides)
    run = build_run(experiment)
    state = create_state(
        run.model, run.tx, run.batch(0), experiment.train.seed, run.state_shardings
    )
    batches = [run.device_batch(i) for i in range(warm + steps)]
    for batch in batches[:warm]:
        state, metrics = run.train_step(state, batch)
    jax.block_until_ready(metrics)
    hlo = run.train_step.lower(state, batches[0]).compile().as_text()
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            start = time.perf_counter()
            for batch in batches[warm:]:
                state, metrics = run.train_step(state, batch)
            jax.block_until_ready(metrics)
            wall_us = (time.perf_counter() - start) * 1e6
        (path,) = Path(tmp).glob("**/perfetto_trace.json.gz")
        trace = json.load(gzip.open(path))
        out.mkdir(parents=True, exist_ok=True)
        if path.stat().st_size < 40e6:
            shutil.copy(path, out / "perfetto_trace.json.gz")
    table = reduce_trace(trace, hlo, jax.default_backend(), steps, wall_us)
    table["overrides"] = overrides
    table["device"] = jax.devices()[0].device_kind
    table["tokens_per_step"] = run.tokens_per_step
    (out / "profile.json").write_text(json.dumps(table, indent=1) + "\n")
    (out / "profile.md").write_text(markdown(table, f"{table['device']}: {' '.join(overrides)}"))
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model (any platform; CI)")
    parser.add_argument("--set", nargs="*", default=[], help="more config overrides")
    parser.add_argument("--warm", type=int, default=3, help="steps before the trace")
    parser.add_argument("--steps", type=int, default=10, help="steps traced")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "profile")
    args = parser.parse_args(argv)
    overrides = [*GPT2, *(QUICK if args.quick else []), *args.set]
    table = profile(overrides, args.warm, args.steps, args.out)
    print(markdown(table, f"{table['device']}: {' '.join(overrides)}"))
    print(f"wrote {args.out / 'profile.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
