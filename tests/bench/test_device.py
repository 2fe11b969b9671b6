"""``python bench/device.py --quick`` runs on the CPU (CI; one attention shape, 16 training
steps, one repeat: the plumbing, not the figures) and writes its JSON: every section
present, every cell that this platform can run measured (no error), the training loop
measured with each steps_per_call and prefetch setting. No figure is asserted: speed is
measured in bench/, never in a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_device_bench_measures_every_cell(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "device.py"), "--quick", "--out", str(tmp_path)]
        + ["--lengths", "128", "--train-steps", "16", "--repeats", "1"],  # one shape, one window
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("cpu-*-quick.json")
    result = json.loads(path.read_text())
    assert result["platform"] == "cpu" and result["matmul"]["tflops"] > 0

    for shape, row in result["attention"].items():
        assert {"pallas", "xla", "blockwise"} <= set(row) and "cudnn" not in row, shape
        for impl in ("pallas", "xla", "blockwise"):
            assert row[impl]["fwd_bwd_tflops"] > 0, (shape, impl, row[impl])

    (train,) = result["train"].values()
    assert set(train) == {f"steps_per_call={k} prefetch={p}" for k in (1, 4) for p in (True, False)}
    for variant, cell in train.items():
        assert cell.get("tokens_per_sec", 0) > 0 and cell["of_matmul"] > 0, (variant, cell)
    for batch, cell in result["decode"]["cells"].items():
        assert cell.get("tokens_per_sec", 0) > 0, (batch, cell)
    assert "training tokens/s" in done.stdout and f"wrote {path}" in done.stdout


def test_levers_are_cumulative_rows_of_one_run(tmp_path):
    """``--train-levers``: each row trains with its own overrides and every row's above it
    (the padded vocabulary, then the chunked loss on top), each measured."""
    sys.path.insert(0, str(ROOT / "bench"))
    import device

    rows = device._variants(False, ["base", "chunk256"])
    assert rows == {
        "base": [],
        "chunk256": ["model.vocab_multiple=128", "train.loss_chunk=256"],
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "device.py"), "--quick", "--out", str(tmp_path)]
        + ["--skip", "attention", "decode", "--train-steps", "16", "--repeats", "1"]
        + ["--train-levers", "base", "chunk256"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("cpu-*-quick.json")
    (train,) = json.loads(path.read_text())["train"].values()
    assert set(train) == {"base", "chunk256"}
    for lever, cell in train.items():
        assert cell.get("tokens_per_sec", 0) > 0, (lever, cell)
