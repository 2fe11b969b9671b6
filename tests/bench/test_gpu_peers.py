"""bench/gpu_peers.py runs our row on the CPU (CI has no torch: the twins are run where the
bench extra is installed, and on the GPU by tools/device_check.sh peers) and writes its
JSON: a positive rate per round, the median of those rounds, the shape it trained on."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_our_row_is_timed_in_rounds_and_written(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_peers.py"), "--quick", "--rows", "tfmjax"]
        + ["--shape", "shakespeare_char", "--steps", "2", "--rounds", "3"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("gpu_peers-shakespeare_char-*-quick.json")
    result = json.loads(path.read_text())
    row = result["rows"]["tfmjax"]
    assert len(row["rounds"]) == 3 and min(row["rounds"]) > 0
    assert row["tokens_per_sec"] == statistics.median(row["rounds"])
    assert result["shape"][1] > 0 and result["flops_per_token"] > 0
    assert set(result["rows"]) == {"tfmjax"} and "tokens/s" in done.stdout
