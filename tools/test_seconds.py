"""Write tests/module_seconds.json from a ``pytest --durations=0`` log: each test module's
total seconds (setup, call and teardown). tests/conftest.py hands the longest modules to the
xdist workers first, so no long module starts last and leaves one worker running alone.

    python -m pytest -n 2 --dist loadgroup -q --durations=0 > durations.log
    python tools/test_seconds.py durations.log
    python tools/test_seconds.py durations.log --slow-above 2.5   # and extend the slow list

Only the order matters for the module order, so a log from a loaded machine serves as well as
a quiet one. ``--slow-above S`` adds every test of the log that took more than S seconds
(setup, call and teardown) to tests/slow_tests.txt, which keeps its entries: take S from a
quiet machine, or scale it by how loaded the machine was.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

# a node id runs to the end of the line: parametrize ids may hold spaces ({'a': 1, 'b': 2})
LINE = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+((\S+?\.py)::.+?)\s*$")
OUT = Path(__file__).resolve().parents[1] / "tests" / "module_seconds.json"
SLOW_LIST = OUT.parent / "slow_tests.txt"


def listed_id(nodeid: str) -> str:
    """A test's id as tests/slow_tests.txt lists it: without the ``@group`` suffix that
    xdist's loadgroup adds to the tests of an ``xdist_group`` (after any ``[param]``)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def module_seconds(log: str) -> dict[str, float]:
    totals: collections.Counter[str] = collections.Counter()
    for line in log.splitlines():
        if match := LINE.match(line):
            totals[match[3]] += float(match[1])
    return {module: round(seconds, 1) for module, seconds in totals.most_common()}


def test_seconds(log: str) -> dict[str, float]:
    """Each test's seconds (node id -> setup + call + teardown) in a ``--durations=0`` log."""
    totals: collections.Counter[str] = collections.Counter()
    for line in log.splitlines():
        if match := LINE.match(line):
            totals[listed_id(match[2])] += float(match[1])
    return dict(totals)


def extend_slow_list(seconds: dict[str, float], above: float) -> list[str]:
    """Append the tests over ``above`` seconds that the slow list lacks; returns them."""
    lines = SLOW_LIST.read_text().splitlines()
    listed = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    new = sorted(t for t, s in seconds.items() if s > above and t not in listed)
    SLOW_LIST.write_text("\n".join([*lines, *new]) + "\n")
    return new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path, help="output of pytest --durations=0")
    parser.add_argument(
        "--slow-above", type=float, help="also list the tests over this many seconds as slow"
    )
    args = parser.parse_args()
    log = args.log.read_text()
    seconds = module_seconds(log)
    if not seconds:
        raise SystemExit("no duration lines in the log: run pytest with --durations=0")
    OUT.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"wrote {OUT} ({len(seconds)} modules, {sum(seconds.values()):.0f} s in all)")
    if args.slow_above is not None:
        new = extend_slow_list(test_seconds(log), args.slow_above)
        print(f"added {len(new)} tests over {args.slow_above:g} s to {SLOW_LIST}")


if __name__ == "__main__":
    main()
