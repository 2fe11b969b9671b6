"""One exploratory run of a config; its eval curve goes to ``experiments/results/attempts/``.

    python experiments/attempt.py NAME configs/CONFIG.toml [key.sub=value ...]

What a config header cites as "tried" comes from these records: the overrides, the curve,
the wall time and the cores the run had (one: the run is pinned to a core, as every run of
the process pool of ``python -m tfmjax.sweep`` is; see ``experiments/sweep.py``). A record
whose config hash is unchanged is not trained again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep import ROOT, Run, is_current, runs_dir, save, train_missing  # noqa: E402

ATTEMPTS = ROOT / "experiments" / "results" / "attempts"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", help="the record's name (its file name, without .json)")
    p.add_argument("config", help="a TOML config, relative to the repository root")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    p.add_argument("--results", help="where records go, runs under RESULTS/runs (tests only)")
    args = p.parse_args(argv)
    path = Path(args.results or ATTEMPTS) / f"{args.name}.json"
    if is_current(path, args.config, args.overrides):
        print(f"{path.name} is current: nothing to train")
        return 0
    root = runs_dir(args.results)
    run = Run("attempts", args.name, args.name, args.config, tuple(args.overrides), root)

    def store(run: Run, record: dict) -> None:
        save(path, {"name": args.name, **record})
        curve = ", ".join(f"{c['step']}: {c.get('exact_match', 0):.3f}" for c in record["curve"])
        print(f"{args.name}: exact-match by step {curve}; {record['wall_sec']:.0f} s")

    return train_missing([run], store)


if __name__ == "__main__":
    sys.exit(main())
