"""``bench/reversible_memory.py`` measures what it says: at a small shape the reversible
stack's compiled step needs less temp memory than the plain stack's, and the saving grows
with depth (the plain stack keeps every layer's activations, the reversible one one layer's).
Compilation only; the figures are in bench/README.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "bench_reversible_memory", ROOT / "bench" / "reversible_memory.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_reversible_saves_more_the_deeper_the_stack(capsys):
    cells = {L: (plain, rev) for L, _, plain, rev in bench.rows([2, 6], [64])}
    (p2, r2), (p6, r6) = cells[2], cells[6]
    assert r6 < p6 and p6 / r6 > p2 / r2
    assert bench.main(["--layers", "1", "--lengths", "16"]) == 0
    assert "plain/rev" in capsys.readouterr().out
