"""tests/slow_tests.txt names whole test ids, and tools/test_seconds.py reads them whole: a
parametrize id may hold spaces (``[{'a': 1, 'b': 2}]``), and an id cut at its first space
matches no test, so the test it meant ran in make test-fast after all."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("test_seconds", ROOT / "tools" / "test_seconds.py")
test_seconds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_seconds)


def test_a_durations_line_gives_the_whole_id():
    log = (
        "4.20s call     tests/a.py::test_x[tiny-llama-{'num_kv_heads': 1, 'window': 3}]\n"
        "0.50s setup    tests/a.py::test_x[tiny-llama-{'num_kv_heads': 1, 'window': 3}]\n"
        "1.00s teardown tests/b.py::test_y\n"
    )
    seconds = test_seconds.test_seconds(log)
    assert seconds == {
        "tests/a.py::test_x[tiny-llama-{'num_kv_heads': 1, 'window': 3}]": 4.7,
        "tests/b.py::test_y": 1.0,
    }
    assert test_seconds.module_seconds(log) == {"tests/a.py": 4.7, "tests/b.py": 1.0}


def test_every_listed_id_is_whole_and_its_module_exists():
    for line in (ROOT / "tests" / "slow_tests.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        module, _, name = line.partition("::")
        assert (ROOT / module).is_file(), line
        assert name.startswith("test_"), line
        assert name.count("[") == name.count("]") and name.endswith("]") == ("[" in name), line


def test_a_grouped_tests_id_loses_its_xdist_group_suffix():
    """xdist's loadgroup writes ``id@group`` for the tests of an ``xdist_group``; the slow
    list and tests/conftest.py use the id without it (a parameter's own ``@`` stays)."""
    module = "tests/sweep/test_sweep_end_to_end.py"
    param = f"{module}::test_a_run[lr=1e-3/seed=1]"
    assert test_seconds.listed_id(f"{param}@sweep_end_to_end") == param
    assert test_seconds.listed_id(f"{module}::test_x@g") == f"{module}::test_x"
    assert test_seconds.listed_id("tests/x.py::test_y[a@b]") == "tests/x.py::test_y[a@b]"
    log = f"3.00s call     {param}@sweep_end_to_end\n1.00s setup    {param}@sweep_end_to_end\n"
    assert test_seconds.test_seconds(log) == {param: 4.0}
