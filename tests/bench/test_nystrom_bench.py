"""``bench/nystrom.py`` compares like with like: its two softmax calls agree with each other
(the blockwise twin of the dense one), and its Nyström call with one landmark per token is
softmax attention up to the pseudo-inverse's convergence. No time is asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_nystrom", ROOT / "bench" / "nystrom.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _qkv(T):
    keys = jax.random.split(jax.random.key(0), 3)
    return [jax.random.normal(key, (1, T, bench.N, bench.H)) for key in keys]


def test_the_two_softmax_calls_agree():
    q, k, v = _qkv(256)
    dense = bench.SYSTEMS["softmax (xla)"](q, k, v)
    flash = bench.SYSTEMS["softmax (blockwise)"](q, k, v)
    np.testing.assert_allclose(np.asarray(flash), np.asarray(dense), rtol=2e-5, atol=2e-5)


def test_the_benched_nystrom_call_is_softmax_at_one_landmark_per_token():
    """T = 64 = the bench's landmarks: every landmark one token. Error 0.03 here (six
    iterations of the pseudo-inverse); 32 landmarks on the same inputs miss by 1.08."""
    q, k, v = _qkv(bench.LANDMARKS)
    got = bench.SYSTEMS[f"nystrom M={bench.LANDMARKS}"](q, k, v)
    want = bench.SYSTEMS["softmax (xla)"](q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.1)


def test_a_short_run_reports_every_cell(capsys):
    results = bench.bench([128], rounds=1)
    assert {(name, mode) for _, name, mode in results} == {
        (name, mode) for name in bench.SYSTEMS for mode in ("fwd", "fwd+bwd")
    }
    assert all(cell["time"] > 0 and cell["temp"] >= 0 for cell in results.values())
    bench.report(results, [128])
    assert capsys.readouterr().out.count("| 128 |") == len(bench.SYSTEMS)
