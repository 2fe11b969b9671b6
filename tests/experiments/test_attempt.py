"""One exploratory run stores its curve as JSON and is not trained again while current."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def attempt(results, *overrides):
    cmd = [sys.executable, str(ROOT / "experiments" / "attempt.py"), "--results", str(results)]
    cmd += ["tiny_copy", "configs/copy_decoder.toml", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_attempt_stores_its_curve_and_skips_a_current_record(tmp_path, tiny_overrides):
    first = attempt(tmp_path, *tiny_overrides)
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads((tmp_path / "tiny_copy.json").read_text())
    assert record["name"] == "tiny_copy" and record["overrides"] == tiny_overrides
    assert [point["step"] for point in record["curve"]] == [2]
    assert 0.0 <= record["exact_match"] <= 1.0 and record["wall_sec"] > 0
    assert "tiny_copy: exact-match by step 2:" in first.stdout
    again = attempt(tmp_path, *tiny_overrides)
    assert again.returncode == 0 and "is current: nothing to train" in again.stdout
