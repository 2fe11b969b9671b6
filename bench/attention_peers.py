"""Our attention kernels beside their peers, in one process and one run: TFLOP/s of the
forward and forward+backward, and each one's speed relative to cuDNN.

    python bench/attention_peers.py                  # on a GPU: T 1k/4k/16k, H 64/128
    python bench/attention_peers.py --quick          # any platform, one tiny shape (plumbing)

Rows (each cell that cannot run, e.g. a mask a peer does not take or a platform it lacks, is
recorded with its one-line reason and the run goes on):

  tfmjax-triton  ``tfmjax.kernels.attention(impl="pallas")`` with ``TFMJAX_PALLAS_GPU=triton``
  tfmjax-mosaic  the same with ``TFMJAX_PALLAS_GPU=mosaic``: the Hopper kernels where they take
                 the call (the cell names the kernel that ran and why)
  cudnn          ``impl="cudnn"``: XLA's cuDNN fused attention
  jax-triton     jax's own Pallas Triton flash attention (``pallas.ops.gpu.attention.mha``)
  jax-mosaic     jax's own Pallas Mosaic GPU attention (``pallas.ops.gpu.attention_mgpu``;
                 its backward refuses causal masks)
  torch-flash    ``torch.nn.functional.scaled_dot_product_attention`` under the flash backend
                 (``[B,N,T,H]`` tensors; torch's own CUDA build on the GPU host)

``--mosaic-tiles`` adds a row per tile setting of the Hopper kernels (:data:`MOSAIC_TILES`:
streamed block of the forward, dQ and dK/dV kernels and the ring's slots, called directly,
not through the dispatch), the same-run search for their defaults, and rows
``mosaic-pingpong=...`` of the first two settings with the forward's compute warpgroups taking
turns on the tensor cores (FlashAttention-3's ping-pong schedule; off by default until such a
row beats its ``mosaic-tiles`` twin).

Shapes are ``bench/device.py``'s (bf16, B*T = 16384 tokens, N*H = 2048; FlashAttention-2's FLOP
count: 4*B*N*T*S*H forward, halved when causal, forward+backward 3.5x). Each cell is the
median of ``--repeats`` calls after one warm-up. Writes
``attention_peers-<device>.json`` under ``--out``. JAX and torch share the GPU: run with
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (``tools/device_check.sh`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
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
from tfmjax.kernels import attention  # noqa: E402

ROWS = ("tfmjax-triton", "tfmjax-mosaic", "cudnn", "jax-triton", "jax-mosaic", "torch-flash")
# (block_k, block_k_dq, block_q_dkv, stages) of tfmjax.kernels.mosaic_attention; the first is
# its default. Rows "mosaic-tiles=<bk>-<bk_dq>-<bq_dkv>-<stages>". Each fits a Hopper SM's
# 232,448 bytes of shared memory at head width 128 (3 slots of 128 keys need 232,576):
# tests/kernels/test_mosaic_gpu.py lowers every one for cuda.
MOSAIC_TILES = [(128, 64, 64, 2), (64, 64, 64, 3), (64, 64, 64, 4), (128, 128, 128, 2),
                (128, 128, 64, 2), (64, 64, 128, 2)]  # fmt: skip


def mosaic_tile_rows() -> list[str]:
    """The ``--mosaic-tiles`` rows: each of :data:`MOSAIC_TILES`, then the first two again with
    the ping-pong schedule."""
    names = ["-".join(map(str, tiles)) for tiles in MOSAIC_TILES]
    return [f"mosaic-tiles={n}" for n in names] + [f"mosaic-pingpong={n}" for n in names[:2]]


def mosaic_row_options(row: str) -> dict:
    """``{"tiles", "pingpong"}`` of ``mosaic_attention.attention`` for a ``--mosaic-tiles`` row."""
    kind, setting = row.split("=")
    tiles = tuple(int(x) for x in setting.split("-"))
    return {"tiles": tiles, "pingpong": kind == "mosaic-pingpong"}


@contextlib.contextmanager
def _pallas_gpu(kernel: str):
    """``TFMJAX_PALLAS_GPU=kernel`` while a function is traced (where the choice is read)."""
    old = os.environ.get(mosaic_attention.PALLAS_GPU_ENV)
    os.environ[mosaic_attention.PALLAS_GPU_ENV] = kernel
    try:
        yield
    finally:
        if old is None:
            del os.environ[mosaic_attention.PALLAS_GPU_ENV]
        else:
            os.environ[mosaic_attention.PALLAS_GPU_ENV] = old


def _jax_forward(row: str, shape: Shape):
    """``forward(q, k, v) -> o`` of a JAX row, all ``[B,T,N,H]``."""
    scale = shape.H**-0.5
    if row in ("tfmjax-triton", "tfmjax-mosaic", "cudnn"):
        impl = "cudnn" if row == "cudnn" else "pallas"
        return lambda q, k, v: attention(q, k, v, causal=shape.causal, impl=impl, scale=scale)
    if row.startswith(("mosaic-tiles=", "mosaic-pingpong=")):
        options = mosaic_row_options(row)
        interpret = _platform() == "cpu"
        return lambda q, k, v: mosaic_attention.attention(
            q, k, v, causal=shape.causal, scale=scale, interpret=interpret, **options
        )
    if row == "jax-triton":
        from jax.experimental.pallas.ops.gpu import attention as jax_attention

        interpret = _platform() == "cpu"
        return lambda q, k, v: jax_attention.mha(
            q, k, v, None, sm_scale=scale, causal=shape.causal, interpret=interpret
        )
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    block = 64  # its tiles: multiples of 64; block_q 64 as its own benchmark sweeps
    config = attention_mgpu.TuningConfig(
        block_q=block, block_kv=128, max_concurrent_steps=2, causal=shape.causal,
        block_q_dkv=block, block_kv_dkv=block, block_q_dq=block, block_kv_dq=block,
    )  # fmt: skip
    return lambda q, k, v: attention_mgpu.attention(q, k, v, config)  # it takes no scale


def jax_cell(row: str, shape: Shape, repeats: int) -> dict:
    kernel = "mosaic" if row == "tfmjax-mosaic" else "triton"
    try:
        forward = _jax_forward(row, shape)

        def loss(q, k, v):
            return jnp.sum(forward(q, k, v).astype(jnp.float32))

        q, k, v = _qkv(shape, jnp.bfloat16)
        with _pallas_gpu(kernel):
            _, fwd = _median_seconds(jax.jit(forward), q, k, v, repeats=repeats)
            _, both = _median_seconds(
                jax.jit(jax.grad(loss, argnums=(0, 1, 2))), q, k, v, repeats=repeats
            )
            cell = {"fwd_ms": fwd * 1e3, "fwd_bwd_ms": both * 1e3}
            if row.startswith("tfmjax"):  # what a cuda lowering runs, and why
                cell["cuda_kernel"] = mosaic_attention.gpu_kernel(q, k)
    except Exception as error:  # noqa: BLE001 -- a cell that cannot run is a result
        return {"error": _short(error)}
    return cell


def torch_cell(shape: Shape, repeats: int) -> dict:
    """torch's SDPA under the flash backend, forward and forward+backward (of the sum)."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        device = "cuda" if torch.cuda.is_available() else "cpu"
        dims = (shape.B, shape.N, shape.T, shape.H)
        q, k, v = (
            torch.randn(dims, device=device, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        sync = torch.cuda.synchronize if device == "cuda" else lambda: None

        def forward():
            with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=shape.causal
                )

        def both():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=shape.causal
                )
            out.float().sum().backward()

        cell = {}
        for name, fn in (("fwd_ms", forward), ("fwd_bwd_ms", both)):
            fn()  # warm-up
            sync()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - start)
            cell[name] = statistics.median(times) * 1e3
    except Exception as error:  # noqa: BLE001 -- no torch, no flash kernel on this platform
        return {"error": _short(error)}
    return cell


def with_rates(cell: dict, shape: Shape, cudnn: dict) -> dict:
    """TFLOP/s of a measured cell, and its speed relative to the same shape's cuDNN cell."""
    if "fwd_ms" not in cell:
        return cell
    flops = shape.forward_flops()
    cell["fwd_tflops"] = flops / cell["fwd_ms"] / 1e9
    cell["fwd_bwd_tflops"] = 3.5 * flops / cell["fwd_bwd_ms"] / 1e9
    if "fwd_ms" in cudnn:
        cell["fwd_of_cudnn"] = cudnn["fwd_ms"] / cell["fwd_ms"]
        cell["fwd_bwd_of_cudnn"] = cudnn["fwd_bwd_ms"] / cell["fwd_bwd_ms"]
    return cell


def print_table(result: dict) -> None:
    print(f"{result['device']}: forward+backward TFLOP/s (x cuDNN)")
    for name, row in result["shapes"].items():
        cells = []
        for peer in result["rows"]:
            c = row[peer]
            text = "-" if "fwd_bwd_tflops" not in c else f"{c['fwd_bwd_tflops']:.3g}"
            if "fwd_bwd_of_cudnn" in c:
                text += f" ({c['fwd_bwd_of_cudnn']:.2f}x)"
            cells.append(f"{peer} {text}")
        print(f"  {name:24s} " + "  ".join(cells))
    for name, row in result["shapes"].items():
        for peer, c in row.items():
            if isinstance(c, dict) and "error" in c:
                print(f"  {name} {peer}: {c['error']}")
            elif peer == "tfmjax-mosaic" and c["cuda_kernel"][0] == "triton":
                print(f"  {name} {peer}: lowers to Triton on cuda ({c['cuda_kernel'][1]})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one tiny shape (any platform)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--lengths", nargs="*", type=int, help="T (default 1k 4k 16k)")
    parser.add_argument("--widths", nargs="*", type=int, help="head widths (64 128)")
    parser.add_argument("--rows", nargs="*", choices=ROWS, default=list(ROWS))
    parser.add_argument("--mosaic-tiles", action="store_true", help="a row per MOSAIC_TILES")
    args = parser.parse_args(argv)
    if args.mosaic_tiles:
        args.rows += mosaic_tile_rows()
    repeats = args.repeats or (1 if args.quick else 5)
    shapes = attention_shapes(args.quick, args.lengths or ((128,) if args.quick else None),
                              args.widths)  # fmt: skip
    device = jax.devices()[0].device_kind
    result = {"platform": _platform(), "device": device, "jax": jax.__version__}
    result.update(rows=args.rows, shapes={})
    for shape in shapes:
        row = result["shapes"][shape.name()] = {"B": shape.B, "N": shape.N}
        for peer in args.rows:
            timed = torch_cell if peer == "torch-flash" else None
            row[peer] = timed(shape, repeats) if timed else jax_cell(peer, shape, repeats)
        for peer in args.rows:
            with_rates(row[peer], shape, row.get("cudnn", {}))
        print(shape.name(), {p: row[p].get("fwd_bwd_ms", "-") for p in args.rows}, flush=True)
    print_table(result)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"attention_peers-{_slug(device)}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
