"""Every toy task x family with three seeds: exact-match and wall time as mean and range.

    python experiments/tasks.py                  # run what is missing, print the table
    python experiments/tasks.py --table         # ... and rewrite its table in docs/studies.md
    python experiments/tasks.py --only copy --only copy_decoder --seeds 0
    python experiments/tasks.py --budget 1800    # stop starting runs after 30 minutes
    python experiments/tasks.py --jobs 1         # one run at a time (default: one per core)
    python experiments/tasks.py --dry-run        # list what would train, train nothing

Each run is ``train.py configs/NAME.toml train.seed=S``, trained by the process pool of
``python -m tfmjax.sweep`` in ``runs/tasks/NAME-seedS-<hash>`` (see ``experiments/sweep.py``);
its result is ``experiments/results/tasks/NAME-seedS.json``, keyed by a hash of the config
(its non-default fields), so a rerun trains only what is missing or whose config changed,
and the sweep can be spread over sittings. Configs start in the order listed (the quickest
first). The seed changes the initialisation and the training batches; the eval set is the
same for every run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep import (  # noqa: E402
    ROOT,
    Run,
    is_current,
    runs_dir,
    save,
    spread,
    train_missing,
    train_options,
    write_table,
)
from sweep import parser as sweep_parser  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "tasks"
TASKS = (
    "copy",
    "reverse",
    "sort",
    "addition_reversed",
    "addition",
    "associative_recall",
    "induction_head",
    "dyck",
    "scan",
)
CONFIGS = [name + suffix for name in TASKS for suffix in ("", "_decoder")]
SEEDS = (0, 1, 2)
BEGIN, END = "<!-- tasks-table -->", "<!-- /tasks-table -->"


def result_path(config: str, seed: int) -> Path:
    return RESULTS / f"{config}-seed{seed}.json"


def overrides(seed: int, extra: list[str]) -> list[str]:
    return [f"train.seed={seed}", *extra]


def pending(configs, seeds, extra: list[str]) -> list[tuple[str, int]]:
    """The (config, seed) runs with no result, or a result of another config."""
    return [
        (config, seed)
        for config in configs
        for seed in seeds
        if not is_current(
            result_path(config, seed), f"configs/{config}.toml", overrides(seed, extra)
        )
    ]


def table(configs, seeds) -> str:
    """Markdown: one row per config over the seeds stored."""
    lines = [
        "| config | seeds | steps | exact-match: mean (min-max) | wall: mean (min-max) "
        "| all >= 99% |",
        "| --- | ---: | ---: | --- | --- | --- |",
    ]
    for config in configs:
        runs = [
            json.loads(result_path(config, s).read_text())
            for s in seeds
            if result_path(config, s).is_file()
        ]
        if not runs:
            lines.append(f"| `{config}` | 0 | | not run | | |")
            continue
        exact = [r.get("exact_match", 0.0) for r in runs]
        wall = [r["wall_sec"] for r in runs]
        solved = "yes" if min(exact) >= 0.99 else "no"
        lines.append(
            f"| `{config}` | {len(runs)} | {runs[0]['step']} | {spread(exact)} "
            f"| {spread(wall, '{:.0f}')} s | {solved} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, CONFIGS)
    parser.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    args = parser.parse_args(argv)
    global RESULTS
    if args.results:
        RESULTS = Path(args.results)
    configs = args.only or CONFIGS
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    runs = {
        Run(
            "tasks",
            f"{config}-seed{seed}",
            f"{config} seed {seed}",
            f"configs/{config}.toml",
            tuple(overrides(seed, args.extra)),
            runs_dir(args.results),
        ): (config, seed)
        for config, seed in pending(configs, seeds, args.extra)
    }

    def store(run: Run, record: dict) -> None:
        config, seed = runs[run]
        save(result_path(config, seed), {"name": config, "seed": seed, **record})
        em = record.get("exact_match", 0)
        print(f"  {run.label}: exact-match {em:.3f}, {record['wall_sec']:.0f} s", flush=True)

    code = train_missing(list(runs), store, **train_options(args))
    print(table(configs, seeds))
    if args.table and not args.dry_run:
        write_table(BEGIN, END, table(CONFIGS, SEEDS))
    return code


if __name__ == "__main__":
    sys.exit(main())
