"""One benchmark command for a device: attention kernels, Pallas block sizes, training and
decoding throughput, measured side by side in one run; a table on stdout and a JSON file.

    python bench/device.py            # at most ~10 minutes on one GPU
    python bench/device.py --quick    # small shapes on any platform (CPU: about a minute; CI)

Writes ``bench/results/<platform>-<device kind>.json`` (``--out DIR`` elsewhere).

Sections (every cell that fails, e.g. out of memory or an implementation this platform does
not have, is recorded with its one-line reason and the run goes on):

* ``matmul``: a large square bf16 ``jnp.dot`` (8192; quick: 512), the same-run yardstick. Its
  TFLOP/s against the device's dense bf16 peak (when the device kind is in :data:`PEAK_BF16`)
  says how near the spec sheet this device gets at all.
* ``attention``: forward and forward+backward of ``tfmjax.kernels.attention`` for each
  implementation the platform runs (pallas, cudnn on cuda, xla, blockwise), T in {1024, 4096,
  16384}, head width 64 and 128, causal and full, bf16, B*T = 16384 tokens and N*H = 2048
  (quick: T in {128, 256}, head width 64, B*T = 256 tokens, N*H = 256).
  Useful FLOPs: 4*B*N*T*S*H forward, halved when causal; forward+backward = 3.5x forward
  (FlashAttention-2's count).
  Each cell: ms, TFLOP/s and the fraction of the same-run matmul rate.
  The Triton kernels' blocks, warps and stages are swept by ``bench/triton_sweep.py``.
* ``train``: tokens/s of the real training loop (``tfmjax.train.train``: batches, metrics,
  the loop's own overheads) for ``configs/reverse.toml``, ``configs/shakespeare_char.toml``
  and GPT-2 small on the Shakespeare text (context 1024, batch 8), bf16 compute, with
  ``train.steps_per_call`` 1 and 16 and ``train.prefetch`` on and off; model FLOP
  utilisation against :data:`PEAK_BF16` (and against the same-run matmul). Steps of the
  first log window (compilation) are not counted. Quick: ``reverse`` only, shrunk, with
  ``steps_per_call`` 1 and 4.
* ``decode``: greedy KV-cached decoding tokens/s for GPT-2 small (random weights, prompt 32,
  128 new tokens) at batch 1 and 32 (quick: tiny-gpt2, 8 new tokens). Training and decoding
  compute in the run's dtype: bf16, on the CPU too (there the attention matmuls take float32
  operands: :mod:`tfmjax.kernels.xla`).

Model FLOPs follow bench/train.py (PaLM's convention: 6 x matmul weights x tokens + the
attention term).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tfmjax.config import load  # noqa: E402
from tfmjax.decode import Greedy, generate  # noqa: E402
from tfmjax.kernels import attention  # noqa: E402
from tfmjax.models import build, preset  # noqa: E402

# Dense bf16 peak FLOP/s by device kind (vendor spec sheets, no sparsity).
PEAK_BF16 = {
    "NVIDIA H100 80GB HBM3": 989e12,  # H100 SXM
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5p": 459e12,
}
IMPLS = ("pallas", "cudnn", "xla", "blockwise")


def _platform() -> str:
    backend = jax.default_backend()
    return "cuda" if backend == "gpu" else backend


def _device_kind() -> str:
    return jax.devices()[0].device_kind


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _short(error: Exception) -> str:
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return f"{type(error).__name__}: {line[:160]}"


def _median_seconds(fn, *args, repeats: int) -> tuple[float, float]:
    """(seconds of the first call, compile included; median seconds of ``repeats`` more)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


# -- matmul ------------------------------------------------------------------------------


def bench_matmul(n: int, dtype, repeats: int) -> dict:
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    _, seconds = _median_seconds(jax.jit(jnp.dot), a, b, repeats=repeats)
    tflops = 2 * n**3 / seconds / 1e12
    peak = PEAK_BF16.get(_device_kind())
    return {
        "n": n,
        "dtype": jnp.dtype(dtype).name,
        "tflops": tflops,
        "of_peak": peak and tflops * 1e12 / peak,
    }


# -- attention ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    T: int
    H: int
    causal: bool
    B: int
    N: int

    def forward_flops(self) -> float:
        return 4 * self.B * self.N * self.T * self.T * self.H * (0.5 if self.causal else 1.0)

    def name(self) -> str:
        return f"T={self.T} H={self.H} {'causal' if self.causal else 'full'}"


def attention_shapes(quick: bool, lengths=None, widths=None) -> list[Shape]:
    """The attention cells; ``lengths`` and ``widths`` (head widths) narrow the default grid."""
    default_lengths, tokens, width = (
        ((128, 256), 256, 256) if quick else ((1024, 4096, 16384), 16384, 2048)
    )
    lengths = lengths or default_lengths
    widths = widths or ((64,) if quick else (64, 128))
    return [
        Shape(T, H, causal, B=max(1, tokens // T), N=width // H)
        for T in lengths
        for H in widths
        for causal in (True, False)
    ]


def _attention_fns(impl: str, shape: Shape):
    def forward(q, k, v):
        return attention(q, k, v, causal=shape.causal, impl=impl)

    def loss(q, k, v):
        return jnp.sum(forward(q, k, v).astype(jnp.float32))

    return jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _qkv(shape: Shape, dtype):
    keys = jax.random.split(jax.random.key(0), 3)
    dims = (shape.B, shape.T, shape.N, shape.H)
    return [jax.random.normal(key, dims, dtype) for key in keys]


def bench_attention_cell(impl, shape, dtype, repeats, matmul_tflops) -> dict:
    try:
        q, k, v = _qkv(shape, dtype)
        forward, backward = _attention_fns(impl, shape)
        _, fwd = _median_seconds(forward, q, k, v, repeats=repeats)
        _, both = _median_seconds(backward, q, k, v, repeats=repeats)
    except Exception as error:  # noqa: BLE001 -- a cell that cannot run is a result
        return {"error": _short(error)}
    flops = shape.forward_flops()
    cell = {"fwd_ms": fwd * 1e3, "fwd_bwd_ms": both * 1e3}
    cell["fwd_tflops"] = flops / fwd / 1e12
    cell["fwd_bwd_tflops"] = 3.5 * flops / both / 1e12
    cell["fwd_bwd_of_matmul"] = cell["fwd_bwd_tflops"] / matmul_tflops
    return cell


def runnable_impls(platform: str, quick: bool) -> list[str]:
    """pallas runs compiled on cuda/rocm/tpu (on cpu only in its interpreter: quick runs it),
    cudnn on cuda only."""
    impls = ["xla", "blockwise"]
    if platform in ("cuda", "rocm", "tpu") or quick:
        impls.insert(0, "pallas")
    if platform == "cuda":
        impls.insert(1, "cudnn")
    return impls


def bench_attention(shapes, impls, dtype, repeats, matmul_tflops) -> dict:
    table = {}
    for shape in shapes:
        row = table[shape.name()] = {"B": shape.B, "N": shape.N}
        for impl in impls:
            row[impl] = bench_attention_cell(impl, shape, dtype, repeats, matmul_tflops)
    return table


# -- training ----------------------------------------------------------------------------

TRAIN_SHAPES = {
    "reverse": ("configs/reverse.toml", []),
    "shakespeare_char": ("configs/shakespeare_char.toml", []),
    "gpt2-small": (
        "configs/shakespeare_char.toml",
        ["model.preset=gpt2-small", "data.task_params.context=1024", "data.batch_size=8"],
    ),
}
QUICK_TRAIN = [
    "model.num_layers=1",
    "model.d_model=32",
    "model.num_heads=2",
    "model.d_ff=64",
    "optim.warmup_steps=1",
]


# The step levers of docs/gpu_speed.md (issue #55), in order: each row trains with the
# overrides of every row above it plus its own, so each is measured against the step before
# it in the same run (``--train-levers``; a later override of a key replaces an earlier one).
LEVERS = {
    "base": [],
    "vocab128": ["model.vocab_multiple=128"],  # 50,257 -> 50,304 columns
    "chunk256": ["train.loss_chunk=256"],  # no float32 [B,T,V] logits
    "batch16": ["data.batch_size=16"],
    "batch32": ["data.batch_size=32"],
    "remat": ["model.remat=true"],
}


def _variants(quick: bool, levers=None) -> dict[str, list[str]]:
    """``{row name: train overrides}``: the steps_per_call x prefetch grid, or ``levers``."""
    if levers:
        chain = list(LEVERS)[: max(list(LEVERS).index(name) for name in levers) + 1]
        rows = {name: sum((LEVERS[n] for n in chain[: i + 1]), []) for i, name in enumerate(chain)}
        return {name: rows[name] for name in chain if name in levers}
    calls = (1, 4) if quick else (1, 16)
    grid = [(k, p) for k in calls for p in (True, False)]
    return {
        f"steps_per_call={k} prefetch={p}": [
            f"train.steps_per_call={k}",
            f"train.prefetch={str(p).lower()}",
        ]
        for k, p in grid
    }


def _train_tokens_per_sec(config: str, overrides: list[str], steps: int, log_every: int) -> dict:
    from tfmjax.train import train
    from tfmjax.train.run import build_run

    with tempfile.TemporaryDirectory() as workdir:
        extra = [
            f"train.workdir={workdir}",
            f"train.steps={steps}",
            f"train.log_every={log_every}",
            f"train.eval_every={steps * 10}",
            f"train.checkpoint_every={steps * 10}",
        ]
        experiment = load(ROOT / config, [*overrides, *extra])
        with contextlib.redirect_stdout(sys.stderr):
            train(experiment, progress=False, plot=False)
        records = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").open()]
        batch = build_run(experiment).batch(0)
    train_records = [r for r in records if r.get("split") == "train" and "timing" in r]
    rates = [r["timing"]["tokens_per_sec"] for r in train_records]
    warm = rates[1:] or rates  # the first window holds the compile
    return {"tokens_per_sec": statistics.median(warm), "experiment": experiment, "batch": batch}


def _flops_per_token(experiment, batch) -> float:
    from train import model_flops  # bench/train.py

    cfg = experiment.model
    params = jax.eval_shape(lambda: build(cfg).init(jax.random.key(0), batch))
    shapes = {key: np.shape(value) for key, value in batch.items()}
    if cfg.family == "encoder_decoder":
        (B, S), T = shapes["inputs"], shapes["targets"][1]
    else:
        (B, T), S = shapes["tokens"], 0
    return model_flops(cfg, params, B, S, T) / (B * T)


def bench_train(
    quick: bool, matmul_tflops: float, steps: int, dtype: str, names=None, levers=None
) -> dict:
    results = {}
    names = names or (["reverse"] if quick else list(TRAIN_SHAPES))
    peak = PEAK_BF16.get(_device_kind())
    for name in names:
        config, overrides = TRAIN_SHAPES[name]
        overrides = [*overrides, f"model.dtype={dtype}", *(QUICK_TRAIN if quick else [])]
        row = results[name] = {}
        for key, flags in _variants(quick, levers).items():
            log_every = 16 if quick else 32  # a multiple of every steps_per_call above
            try:
                got = _train_tokens_per_sec(config, [*overrides, *flags], steps, log_every)
            except Exception as error:  # noqa: BLE001 -- recorded, the run goes on
                row[key] = {"error": _short(error)}
                continue
            flops = got["tokens_per_sec"] * _flops_per_token(got["experiment"], got["batch"])
            row[key] = {
                "tokens_per_sec": got["tokens_per_sec"],
                "model_tflops": flops / 1e12,
                "mfu": peak and flops / peak,
                "of_matmul": flops / 1e12 / matmul_tflops,
            }
    return results


# -- decoding ----------------------------------------------------------------------------


def bench_decode(quick: bool, repeats: int, dtype: str) -> dict:
    cfg = preset("tiny-gpt2" if quick else "gpt2-small", dtype=dtype)
    model = build(cfg)
    prompt_len, new_tokens = (8, 8) if quick else (32, 128)
    results = {}
    for batch in (1, 32):
        prompts = np.random.default_rng(0).integers(5, cfg.vocab_size, (batch, prompt_len))
        prompts = jnp.asarray(prompts, jnp.int32)
        try:
            params = model.init(jax.random.key(0), {"tokens": prompts})
            _, seconds = _median_seconds(
                lambda p, x: generate(model, p, x, Greedy(), new_tokens, eos_id=None).tokens,
                params,
                prompts,
                repeats=repeats,
            )
        except Exception as error:  # noqa: BLE001 -- recorded, the run goes on
            results[f"batch={batch}"] = {"error": _short(error)}
            continue
        results[f"batch={batch}"] = {"tokens_per_sec": batch * new_tokens / seconds}
    return {"model": "tiny-gpt2" if quick else "gpt2-small", "prompt": prompt_len,
            "new_tokens": new_tokens, "cells": results}  # fmt: skip


# -- report ------------------------------------------------------------------------------


def _fmt(cell: dict, key: str, spec: str) -> str:
    if "error" in cell:
        return "error"
    value = cell.get(key)
    return "-" if value is None else format(value, spec)


def print_report(result: dict) -> None:
    m = result["matmul"]
    peak = f", {m['of_peak']:.0%} of the spec peak" if m["of_peak"] else ""
    print(f"{result['device']} ({result['platform']}), jax {result['jax']}")
    print(f"matmul {m['n']}^2 {m['dtype']}: {m['tflops']:.1f} TFLOP/s{peak}\n")
    if "attention" in result:
        print("attention fwd+bwd TFLOP/s (fraction of the matmul)")
    for shape, row in result.get("attention", {}).items():
        cells = [
            f"{impl} {_fmt(c, 'fwd_bwd_tflops', '.2f')} ({_fmt(c, 'fwd_bwd_of_matmul', '.2f')})"
            for impl, c in row.items()
            if isinstance(c, dict)
        ]
        print(f"  {shape:24s} " + "  ".join(cells))
    if "train" in result:
        print("\ntraining tokens/s (MFU)")
    for name, row in result.get("train", {}).items():
        cells = [
            f"{k}: {_fmt(c, 'tokens_per_sec', ',.0f')} ({_fmt(c, 'mfu', '.1%')})"
            for k, c in row.items()
        ]
        print(f"  {name:18s} " + "  ".join(cells))
    d = result.get("decode")
    if d:
        cells = [f"{k}: {_fmt(c, 'tokens_per_sec', ',.0f')}" for k, c in d["cells"].items()]
        print(f"\ndecode {d['model']} tokens/s: " + "  ".join(cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (any platform; CI)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--skip", nargs="*", default=[], choices=["attention", "train", "decode"])
    parser.add_argument("--lengths", nargs="*", type=int, help="attention T (default 1k 4k 16k)")
    parser.add_argument("--widths", nargs="*", type=int, help="attention head widths (64 128)")
    parser.add_argument("--train-shapes", nargs="*", choices=list(TRAIN_SHAPES))
    parser.add_argument("--train-steps", type=int, default=None, help="steps per run (320)")
    parser.add_argument(
        "--train-levers", nargs="*", choices=list(LEVERS), help="rows of LEVERS, cumulative"
    )
    args = parser.parse_args(argv)
    platform, quick = _platform(), args.quick
    repeats = args.repeats or (2 if quick else 5)
    dtype = jnp.bfloat16
    result = {"platform": platform, "device": _device_kind(), "jax": jax.__version__,
              "quick": quick, "dtype": jnp.dtype(dtype).name}  # fmt: skip
    result["matmul"] = bench_matmul(512 if quick else 8192, dtype, repeats)
    matmul_tflops = result["matmul"]["tflops"]
    if "attention" not in args.skip:
        shapes = attention_shapes(quick, args.lengths, args.widths)
        impls = runnable_impls(platform, quick)
        result["attention"] = bench_attention(shapes, impls, dtype, repeats, matmul_tflops)
    if "train" not in args.skip:
        steps = args.train_steps or (32 if quick else 320)
        result["train"] = bench_train(
            quick, matmul_tflops, steps, result["dtype"], args.train_shapes, args.train_levers
        )
    if "decode" not in args.skip:
        result["decode"] = bench_decode(quick, repeats, result["dtype"])
    print_report(result)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{platform}-{_slug(result['device'])}{'-quick' if quick else ''}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
