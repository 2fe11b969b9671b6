"""``python bench/mixer_decode.py`` on the CPU, shrunk: every cell measured (no error), the
decoding state's bytes growing with the context for softmax attention and fixed for the
recurrent mixers, as the cache formulas say. No speed is asserted: speed is measured in
bench/, never in a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_cell_is_measured_and_only_softmax_caches_grow(tmp_path):
    out = tmp_path / "cells.json"
    args = ["--quick", "--layers", "1", "--contexts", "16", "48", "--steps", "2"]
    args += ["--repeats", "1", "--only", "MHA", "retention", "selective", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "mixer_decode.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    cells = {(c["system"], c["context"]): c for c in result["cells"]}
    assert [c for c in cells.values() if "error" in c] == []
    assert {system for system, _ in cells} == {"MHA", "retention", "selective_scan (P=16)"}
    for cell in cells.values():
        assert cell["step_ms"] > 0 and cell["prefill_tokens_per_s"] > 0
    size = {key: c["cache_bytes_per_sequence"] for key, c in cells.items()}
    # MHA: 2 (k, v) x 1 layer x 4 heads x (T + 2 steps) x 32 wide x 4 bytes
    assert size["MHA", 16] == 2 * 4 * (16 + 2) * 32 * 4
    assert size["MHA", 48] == 2 * 4 * (48 + 2) * 32 * 4
    assert size["retention", 16] == size["retention", 48]
    assert size["selective_scan (P=16)", 16] == size["selective_scan (P=16)", 48]
