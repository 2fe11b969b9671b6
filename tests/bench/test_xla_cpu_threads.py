"""``bench/xla_cpu_threads.py`` times each distinct matmul of a step once per dot library:
its list must hold every shape of ``bench/gemm.py``'s list, each form once. No figure is
asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "bench_xla_cpu_threads", ROOT / "bench" / "xla_cpu_threads.py"
)
threads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(threads)


def test_every_matmul_of_the_step_is_listed_once_in_each_form():
    config = ROOT / "configs" / "shakespeare_char.toml"
    listed = threads.shapes(config)
    assert len(listed) == len(set(listed))
    gemm = threads.load_gemm()
    rows, layers = gemm.step_matmuls(config)
    wanted = {(form, rows, k, n) for _, k, n, _ in layers for form in gemm.FORMS}
    assert set(listed) == wanted
    # query, key/value and attention out share 128x128: 4 distinct shapes, 3 forms each
    assert len(listed) == 3 * len({(k, n) for _, k, n, _ in layers})
