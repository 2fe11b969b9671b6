"""The Triton flash kernels' settings swept per attention shape on a GPU, and the table of
:mod:`tfmjax.kernels.pallas_tuning` written from the result.

    python bench/triton_sweep.py --out DIR               # on the GPU: about 1-2 minutes a shape
    python bench/triton_sweep.py --record DIR/triton_sweep-<device>.json   # rewrite TUNED
    python bench/triton_sweep.py --quick --out DIR       # any platform, tiny (plumbing; CI)

For each shape (T, head width, causal; bf16, B*T = 16384 tokens and N*H = 2048 as in
``bench/device.py``) the search goes one kernel at a time, the others held: the forward over
its blocks x ``num_warps`` x ``num_stages`` (:data:`FWD_BLOCKS`, :data:`WARPS`,
:data:`STAGES`), timed forward only; then dK/dV's and then dQ's, timed forward+backward with
the kernels already searched at their best. Every shape starts with the defaults, the
same-run baseline. A setting that cannot compile (shared memory) is a cell with its
one-line reason. Shapes run in :data:`PRIORITY` order (the issue's target shape first);
no new shape starts after ``--budget`` seconds, and ``--missing`` skips the shapes
:data:`~tfmjax.kernels.pallas_tuning.TUNED` already holds for this GPU, so the sweep can
span device sessions. ``--record`` keeps a shape's best only where its forward+backward
beat the defaults by :data:`MIN_GAIN` (else the defaults stay: no row).

Writes ``triton_sweep-<device>.json``: per shape the defaults' and the best's milliseconds
and every cell. On a CPU Pallas runs in its interpreter, where warps and stages do nothing:
``--quick`` there checks the plumbing, not speed.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from device import (  # noqa: E402
    Shape,
    _median_seconds,
    _platform,
    _qkv,
    _short,
    _slug,
    attention_shapes,
)

import tfmjax.kernels.mosaic_attention as mosaic_attention  # noqa: E402
import tfmjax.kernels.pallas_attention as pallas_attention  # noqa: E402
from tfmjax.kernels import pallas_tuning  # noqa: E402
from tfmjax.kernels.pallas_tuning import KERNELS, BlockSizes, Launch  # noqa: E402

FWD_BLOCKS = [(128, 64), (128, 128), (64, 64), (64, 128)]
DKV_BLOCKS = [(32, 128), (64, 128), (64, 64), (128, 128)]
DQ_BLOCKS = [(128, 32), (128, 64), (64, 64), (64, 128)]
WARPS = (4, 8)
STAGES = (2, 3)
CANDIDATE_BLOCKS = {"fwd": FWD_BLOCKS, "dkv": DKV_BLOCKS, "dq": DQ_BLOCKS}
# (T, head width, causal), most wanted first: the target of issue #56, then its table.
PRIORITY = [(4096, 128, True), (4096, 128, False), (16384, 128, True), (1024, 128, True),
            (16384, 128, False), (1024, 128, False), (4096, 64, True), (16384, 64, True),
            (1024, 64, True), (4096, 64, False), (16384, 64, False), (1024, 64, False)]  # fmt: skip
MIN_GAIN = 0.02  # a best within 2% of the defaults is noise: no row
TABLE = ROOT / "tfmjax" / "kernels" / "pallas_tuning.py"
BEGIN, END = "    # tuned rows\n", "    # /tuned rows\n"


def _settings(blocks: BlockSizes, launch: Launch) -> dict:
    """``{kernel: [query block, key block, warps, stages]}``: a cell's settings."""
    return {k: [*blocks.of(k), *getattr(launch, k)] for k in KERNELS}


def _from_settings(settings: dict) -> tuple[BlockSizes, Launch]:
    blocks = BlockSizes(*(b for k in KERNELS for b in settings[k][:2]))
    return blocks, Launch(*(tuple(settings[k][2:]) for k in KERNELS))


def _time(shape: Shape, settings: dict, backward: bool, repeats: int) -> dict:
    """``{"ms"}`` of the forward (or forward+backward) under ``settings``, or ``{"error"}``."""
    blocks, launch = _from_settings(settings)

    def forward(q, k, v):
        return pallas_attention.attention(
            q, k, v, causal=shape.causal, q_segment_ids=None, kv_segment_ids=None,
            window=None, alibi_slopes=None, bias=None, q_offset=0, scale=shape.H**-0.5,
            block_sizes=blocks, launch=launch,
        )  # fmt: skip

    def loss(q, k, v):
        return jnp.sum(forward(q, k, v).astype(jnp.float32))

    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)) if backward else forward)
    try:
        _, seconds = _median_seconds(fn, *_qkv(shape, jnp.bfloat16), repeats=repeats)
    except Exception as error:  # noqa: BLE001 -- a setting that cannot run is a result
        return {"error": _short(error)}
    return {"ms": seconds * 1e3}


def sweep_shape(shape: Shape, repeats: int, quick: bool) -> dict:
    """The one-kernel-at-a-time search of one shape (see the module docstring)."""
    defaults = _settings(BlockSizes.for_platform("cuda", shape.H), Launch())
    best = {k: list(v) for k, v in defaults.items()}
    result = {"B": shape.B, "N": shape.N, "defaults": defaults, "cells": {}}
    result["default_fwd_ms"] = _time(shape, defaults, False, repeats).get("ms")
    result["default_fwd_bwd_ms"] = _time(shape, defaults, True, repeats).get("ms")
    for kernel in KERNELS:
        blocks = CANDIDATE_BLOCKS[kernel][: 2 if quick else None]
        warps, stages = (WARPS, STAGES[:1]) if quick else (WARPS, STAGES)
        cells = result["cells"][kernel] = {}
        for bq, bk in blocks:
            for w in warps:
                for s in stages:
                    settings = {**best, kernel: [bq, bk, w, s]}
                    cells[f"{bq}x{bk} w{w} s{s}"] = cell = _time(
                        shape, settings, kernel != "fwd", repeats
                    )
                    cell["settings"] = settings[kernel]
        timed = [c for c in cells.values() if "ms" in c]
        if timed:
            best[kernel] = min(timed, key=lambda c: c["ms"])["settings"]
    result["best"] = best
    result["best_fwd_ms"] = _time(shape, best, False, repeats).get("ms")
    result["best_fwd_bwd_ms"] = _time(shape, best, True, repeats).get("ms")
    return result


def shapes_to_sweep(quick: bool, lengths, widths, missing: bool, family) -> list[Shape]:
    if quick:
        return [Shape(128, 64, True, B=2, N=2)]
    grid = {(s.T, s.H, s.causal): s for s in attention_shapes(False, lengths, widths)}
    wanted = [key for key in PRIORITY if key in grid]
    if missing:
        wanted = [w for w in wanted if (family, *w) not in pallas_tuning.TUNED]
    return [grid[key] for key in wanted]


# -- recording ---------------------------------------------------------------------------


def rows_of(result: dict) -> dict[tuple, tuple[tuple, str]]:
    """``{TUNED key: (value, comment)}`` for the shapes whose best beat the defaults."""
    family = pallas_tuning.gpu_family(result["device"])
    if family is None:
        raise SystemExit(f"triton_sweep --record: no GPU family for {result['device']!r}")
    day = result["date"][:10]
    rows = {}
    for shape in result["shapes"].values():
        base, best = shape.get("default_fwd_bwd_ms"), shape.get("best_fwd_bwd_ms")
        if base is None or best is None or best > base * (1 - MIN_GAIN):
            continue
        T, H, causal = shape["T"], shape["H"], shape["causal"]
        key = (family, T, 1 << max(H - 1, 0).bit_length(), causal)
        value = tuple(tuple(shape["best"][k]) for k in KERNELS)
        rows[key] = (value, f"{result['device']} {day}: fwd+bwd {base:.3f} -> {best:.3f} ms")
    return rows


ROW = re.compile(r'    # (.*)\n    \("(\w+)", (\d+), (\d+), (True|False)\): (\(.*\)),\n')


def record(result: dict, table: Path = TABLE) -> int:
    """Merge the result's rows into :data:`TUNED` in ``table`` (same key: the new row)."""
    head, rest = table.read_text().split(BEGIN)
    old, tail = rest.split(END)
    rows = {
        (family, int(T), int(H), causal == "True"): (ast.literal_eval(value), comment)
        for comment, family, T, H, causal, value in ROW.findall(old)
    }
    new = rows_of(result)
    rows.update(new)
    body = "".join(
        f'    # {comment}\n    ("{family}", {T}, {H}, {causal}): {value!r},\n'
        for (family, T, H, causal), (value, comment) in sorted(rows.items())
    )
    table.write_text(head + BEGIN + body + END + tail)
    return len(new)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one tiny shape (any platform)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--budget", type=float, default=480, help="seconds: no shape after")
    parser.add_argument("--lengths", nargs="*", type=int, help="T (default 4k 16k 1k)")
    parser.add_argument("--widths", nargs="*", type=int, help="head widths (128 64)")
    parser.add_argument("--missing", action="store_true", help="skip shapes TUNED holds")
    parser.add_argument("--record", type=Path, help="a sweep's JSON: rewrite TUNED's rows")
    args = parser.parse_args(argv)
    if args.record:
        count = record(json.loads(args.record.read_text()))
        print(f"recorded {count} rows in {TABLE.relative_to(ROOT)}")
        return 0
    os.environ[mosaic_attention.PALLAS_GPU_ENV] = "triton"  # the kernels swept, whatever is set
    device = jax.devices()[0].device_kind
    repeats = args.repeats or (1 if args.quick else 5)
    now = datetime.datetime.now(datetime.UTC).isoformat()
    result = {"platform": _platform(), "device": device, "jax": jax.__version__, "date": now}
    result["shapes"] = {}
    family = pallas_tuning.gpu_family(device)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"triton_sweep-{_slug(device)}.json"
    start = time.perf_counter()
    for shape in shapes_to_sweep(args.quick, args.lengths, args.widths, args.missing, family):
        if time.perf_counter() - start > args.budget:
            print(f"budget of {args.budget:.0f} s spent: {shape.name()} and after not swept")
            break
        swept = result["shapes"][shape.name()] = sweep_shape(shape, repeats, args.quick)
        swept.update(T=shape.T, H=shape.H, causal=shape.causal)
        path.write_text(json.dumps(result, indent=1) + "\n")  # after each shape: kept if cut
        print(f"{shape.name():24s} fwd+bwd ms: defaults {swept['default_fwd_bwd_ms']}, "
              f"best {swept['best_fwd_bwd_ms']} {swept['best']}", flush=True)  # fmt: skip
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
