"""Which capacity a mixture of experts should train, evaluate and decode with: measured.

    python experiments/moe_capacity.py            # train, evaluate what is missing; the table
    python experiments/moe_capacity.py --table    # ... and rewrite its table in docs/moe.md
    python experiments/moe_capacity.py --only copy --seeds 0

Each task trains a dense model and a mixture (4 experts, top-2, in every block) twice: with
capacity factor 1.25 (Switch's), and dropless (capacity factor 0: Mixtral, MegaBlocks). Each
mixture trained with a capacity is then evaluated three ways from its last checkpoint: at
the training capacity (what tfmjax did before ``model.moe_eval_capacity_factor``), at a
separate evaluation capacity of 2.0 (t5x's evaluation capacity factor), and dropless (the
default now). Exact-match is greedy KV-cached decoding, which feeds one token a step and so
never drops a token whatever the setting; token accuracy and loss are teacher-forced, the
forward that the evaluation capacity limits. Step time: the median ``steps_per_sec`` of
the training log windows after the first (compilation), each run pinned to one core.

Runs train through the process pool of ``experiments/sweep.py``; a result is
``experiments/results/moe/TASK-TRAINING-seedS.json``, keyed by a hash of the config, with
one entry per evaluation setting, so a rerun trains and evaluates only what is missing.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
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
    write_table,
)
from sweep import parser as sweep_parser  # noqa: E402

from tfmjax.reporting.metrics_log import METRICS_FILE, read_records  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "moe"
PAGE = ROOT / "docs" / "moe.md"
SEEDS = (0, 1, 2)
TASKS = {
    "copy": "configs/copy_decoder.toml",
    "reverse": "configs/reverse_decoder.toml",
    "shakespeare_char": "configs/shakespeare_char.toml",
}
MIXTURE = ("model.moe_experts=4", "model.moe_top_k=2")
TRAININGS = {
    "dense": (),
    "capacity": (*MIXTURE, "model.moe_capacity_factor=1.25"),
    "dropless": (*MIXTURE, "model.moe_capacity_factor=0"),
}
# Per training: the evaluation capacity factors to measure ("" = the model's own: dense)
EVALUATIONS = {"dense": ("",), "capacity": ("1.25", "2.0", "0.0"), "dropless": ("0.0",)}
ROWS = (  # (training, evaluation, the row's name)
    ("dense", "", "dense"),
    ("capacity", "1.25", "capacity 1.25, evaluated at 1.25 (before)"),
    ("capacity", "2.0", "capacity 1.25, evaluated at 2.0 (t5x's evaluation factor)"),
    ("capacity", "0.0", "capacity 1.25, evaluated dropless (the default)"),
    ("dropless", "0.0", "dropless everywhere (Mixtral, MegaBlocks)"),
)
METRICS = ("exact_match", "token_accuracy", "loss")
BEGIN, END = "<!-- moe-capacity-table -->", "<!-- /moe-capacity-table -->"


# shakespeare_char trains 500 of its config's 2000 steps: its mixtures take 4-5 times the
# dense model's time on one core, and the question here is how the capacity settings compare
TASK_OVERRIDES = {"shakespeare_char": ("train.steps=500",)}


def overrides_of(task: str, training: str, seed: int, extra=()) -> list[str]:
    return [*TASK_OVERRIDES.get(task, ()), *TRAININGS[training], f"train.seed={seed}", *extra]


def result_path(task: str, training: str, seed: int) -> Path:
    return RESULTS / f"{task}-{training}-seed{seed}.json"


def run_of(task: str, training: str, seed: int, extra, root: Path) -> Run:
    overrides = tuple(overrides_of(task, training, seed, extra))
    name = f"{task}-{training}-seed{seed}"
    return Run("moe", name, f"{task} {training}, seed {seed}", TASKS[task], overrides, root)


def steps_per_sec(workdir: Path) -> float | None:
    """The median training speed of the log windows after the first (which compiles)."""
    train = [r for r in read_records(workdir / METRICS_FILE) if r.get("split") == "train"]
    speeds = [r["timing"]["steps_per_sec"] for r in train[1:] if "timing" in r]
    return round(statistics.median(speeds), 2) if speeds else None


def evaluate_at(workdir: Path, factor: str) -> dict:
    """``eval.py``'s metrics of the last checkpoint with ``model.moe_eval_capacity_factor``
    set to ``factor`` ("" leaves the model as it is)."""
    import tfmjax

    m = tfmjax.load(workdir)
    if factor:
        model = dataclasses.replace(m.config.model, moe_eval_capacity_factor=float(factor))
        m = dataclasses.replace(m, config=dataclasses.replace(m.config, model=model))
    metrics = tfmjax.evaluate(m, rows=0)
    return {k: metrics[k] for k in METRICS if k in metrics}


def complete(path: Path, run: Run, training: str, record: dict) -> None:
    """Add the missing evaluations of ``record`` (a finished run) and store it."""
    evals = record.setdefault("evals", {})
    for factor in EVALUATIONS[training]:
        if factor not in evals and not record.get("diverged_at"):
            evals[factor] = evaluate_at(run.workdir, factor)
    record["steps_per_sec"] = steps_per_sec(run.workdir)
    save(path, record)


def stored(task: str, training: str, seeds, extra=()) -> list[dict]:
    return [
        json.loads(result_path(task, training, s).read_text())
        for s in seeds
        if is_current(
            result_path(task, training, s), TASKS[task], overrides_of(task, training, s, extra)
        )
    ]


def table(tasks, seeds, extra=()) -> str:
    """Mean (range) over the stored seeds of each task and row."""
    lines = [
        "| task | training, evaluation | seeds | exact-match | token accuracy | loss | steps/s |",
        "| --- | --- | ---: | --- | --- | --- | ---: |",
    ]
    for task in tasks:
        for training, factor, name in ROWS:
            records = [r for r in stored(task, training, seeds, extra) if factor in r["evals"]]
            evals = [r["evals"][factor] for r in records]
            cells = [spread([e[k] for e in evals if k in e]) for k in METRICS]
            speeds = [r["steps_per_sec"] for r in records if r.get("steps_per_sec")]
            speed = f"{sum(speeds) / len(speeds):.1f}" if speeds else ""
            lines.append(f"| `{task}` | {name} | {len(records)} | {' | '.join(cells)} | {speed} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, sorted(TASKS))
    parser.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    args = parser.parse_args(argv)
    global RESULTS
    if args.results:
        RESULTS = Path(args.results)
    tasks = args.only or list(TASKS)
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    root = runs_dir(args.results)
    keys = [(t, tr, s) for s in seeds for t in tasks for tr in TRAININGS]
    runs = {run_of(t, tr, s, args.extra, root): (t, tr, s) for t, tr, s in keys}
    todo = {}
    for run, (task, training, seed) in runs.items():
        path = result_path(task, training, seed)
        if not is_current(path, TASKS[task], list(run.overrides)):
            todo[run] = (task, training, seed)
            continue
        record = json.loads(path.read_text())
        if set(EVALUATIONS[training]) - set(record["evals"]):
            complete(path, run, training, record)

    def store(run: Run, record: dict) -> None:
        task, training, seed = todo[run]
        record = {"task": task, "training": training, "seed": seed, **record}
        complete(result_path(task, training, seed), run, training, record)
        print(f"  {run.label}: {record['wall_sec']:.0f} s, step {record['step']}", flush=True)

    code = train_missing(
        list(todo),
        store,
        jobs=args.jobs,
        pin=not args.no_pin,
        budget=args.budget,
        dry_run=args.dry_run,
    )
    print(table(tasks, seeds, args.extra))
    if args.table and not args.dry_run:
        write_table(BEGIN, END, table(list(TASKS), SEEDS), PAGE)
    return code


if __name__ == "__main__":
    sys.exit(main())
