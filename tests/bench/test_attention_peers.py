"""bench/attention_peers.py on the CPU (the plumbing, never a figure): our Pallas row and
jax's own Pallas Triton kernel run interpreted and are timed, with their TFLOP/s; a peer
this platform lacks (cuDNN here) is a cell with its one-line reason, and the run goes on;
our rows say which kernel a cuda lowering would run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_peers_time_what_runs_and_explain_the_rest(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "attention_peers.py"), "--quick"]
        + ["--rows", "tfmjax-triton", "tfmjax-mosaic", "cudnn", "jax-triton"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("attention_peers-cpu-quick.json")
    result = json.loads(path.read_text())
    assert set(result["shapes"]) == {"T=128 H=64 causal", "T=128 H=64 full"}
    for name, row in result["shapes"].items():
        for peer in ("tfmjax-triton", "tfmjax-mosaic", "jax-triton"):
            cell = row[peer]
            assert cell["fwd_ms"] > 0 and cell["fwd_bwd_tflops"] > 0, (name, peer, cell)
        assert row["tfmjax-triton"]["cuda_kernel"][0] == "triton"
        assert "cuDNN's fused attention runs on CUDA GPUs only" in row["cudnn"]["error"]
        assert "fwd_of_cudnn" not in row["tfmjax-triton"]  # no cuDNN cell to divide by
    assert "forward+backward TFLOP/s (x cuDNN)" in done.stdout
