"""bench/triton_sweep.py: the one-kernel-at-a-time search runs on the CPU (Pallas interpreted:
the plumbing, never a figure), and ``--record`` writes the rows that beat the defaults into
a copy of :mod:`tfmjax.kernels.pallas_tuning` that parses, passes the formatter, and keeps
rows recorded before."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import triton_sweep  # noqa: E402


@pytest.mark.slow
def test_quick_sweep_times_every_candidate(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "triton_sweep.py"),
            "--quick",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("triton_sweep-*.json")
    (shape,) = json.loads(path.read_text())["shapes"].values()
    assert shape["default_fwd_bwd_ms"] > 0 and shape["best_fwd_bwd_ms"] > 0
    for kernel in ("fwd", "dkv", "dq"):
        cells = shape["cells"][kernel]
        assert len(cells) == 4 and all(cell["ms"] > 0 for cell in cells.values()), cells
        assert shape["best"][kernel] in [cell["settings"] for cell in cells.values()]


def _shape(T, H, causal, base, best):
    return {
        "T": T,
        "H": H,
        "causal": causal,
        "default_fwd_bwd_ms": base,
        "best_fwd_bwd_ms": best,
        "best": {"fwd": [128, 128, 8, 3], "dkv": [64, 128, 8, 2], "dq": [128, 64, 4, 3]},
    }


def _tuned(path: Path) -> dict:
    """``TUNED`` of the module at ``path``: its dict literal, parsed (the module parses)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign) and node.target.id == "TUNED":
            return ast.literal_eval(node.value)
    raise AssertionError(f"no TUNED in {path}")


def test_record_keeps_only_gains_and_merges(tmp_path):
    table = tmp_path / "pallas_tuning.py"
    table.write_text((ROOT / "tfmjax" / "kernels" / "pallas_tuning.py").read_text())
    first = {
        "device": "NVIDIA H200",
        "date": "2026-12-02T10:00:00+00:00",
        "shapes": {
            "a": _shape(4096, 128, True, 4.0, 3.0),  # 25% faster: a row
            "b": _shape(1024, 128, True, 1.0, 0.99),  # within 2%: no row
            "c": _shape(16384, 96, False, 9.0, None),  # failed: no row
        },
    }
    assert triton_sweep.record(first, table) == 1
    tuned = _tuned(table)
    assert tuned == {
        ("hopper", 4096, 128, True): ((128, 128, 8, 3), (64, 128, 8, 2), (128, 64, 4, 3))
    }
    assert "NVIDIA H200 2026-12-02: fwd+bwd 4.000 -> 3.000 ms" in table.read_text()

    second = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-12-03T00:00:00+00:00"}
    second["shapes"] = {"d": _shape(1024, 64, False, 2.0, 1.0)}
    assert triton_sweep.record(second, table) == 1
    tuned = _tuned(table)
    assert set(tuned) == {("hopper", 4096, 128, True), ("hopper", 1024, 64, False)}
    ruff = Path(sys.executable).parent / "ruff"
    checked = subprocess.run([str(ruff), "format", "--check", str(table)], capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def test_record_refuses_a_device_without_a_family():
    result = {"device": "cpu", "date": "2026-12-02", "shapes": {}}
    with pytest.raises(SystemExit, match="no GPU family for 'cpu'"):
        triton_sweep.rows_of(result)
