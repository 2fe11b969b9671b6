"""bench/moe.py's wall clock for the loss at equal wall time: the first chunk (which holds
the compile) is counted at the median rate of the others, then chunk seconds add up."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_moe", ROOT / "bench" / "moe.py")
bench_moe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_moe)


def test_the_first_chunk_is_counted_without_its_compile():
    # (steps, seconds, loss): 10 steps with a 30 s compile, then 10 steps of 2 s and of 4 s
    curve = [(10, 32.0, 3.0), (10, 2.0, 2.5), (10, 4.0, 2.0)]
    tokens_per_step = 100
    rates = [10 * 100 / 2.0, 10 * 100 / 4.0]  # tokens/s of the chunks after the first
    seconds, losses = bench_moe.wall_clock(curve, tokens_per_step, rates)
    per_step = tokens_per_step / np.median(rates)  # 100 / 375 tokens/s
    np.testing.assert_allclose(seconds, [10 * per_step, 10 * per_step + 2, 10 * per_step + 6])
    np.testing.assert_array_equal(losses, [3.0, 2.5, 2.0])
    # a model read at another's finishing time: linear between its chunk ends
    assert np.interp(seconds[0] + 1.0, seconds, losses) == 2.75
