"""Write tests/module_seconds.json from a ``pytest --durations=0`` log: each test module's
total seconds (setup, call and teardown). tests/conftest.py hands the longest modules to the
xdist workers first, so no long module starts last and leaves one worker running alone.

    python -m pytest -n 2 --dist loadgroup -q --durations=0 > durations.log
    python tools/test_seconds.py durations.log

Only the order matters, so a log from a loaded machine serves as well as a quiet one.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

LINE = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+?\.py)::")
OUT = Path(__file__).resolve().parents[1] / "tests" / "module_seconds.json"


def module_seconds(log: str) -> dict[str, float]:
    totals: collections.Counter[str] = collections.Counter()
    for line in log.splitlines():
        if match := LINE.match(line):
            totals[match[2]] += float(match[1])
    return {module: round(seconds, 1) for module, seconds in totals.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path, help="output of pytest --durations=0")
    seconds = module_seconds(parser.parse_args().log.read_text())
    if not seconds:
        raise SystemExit("no duration lines in the log: run pytest with --durations=0")
    OUT.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"wrote {OUT} ({len(seconds)} modules, {sum(seconds.values()):.0f} s in all)")


if __name__ == "__main__":
    main()
