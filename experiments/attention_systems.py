"""Train every attention system on the same tasks and tabulate them against softmax attention.

    python experiments/attention_systems.py            # run what is missing, print the table
    python experiments/attention_systems.py --table   # ... and rewrite its table in docs/studies.md
    python experiments/attention_systems.py --only reverse --variants softmax,mla
    python experiments/attention_systems.py --jobs 2 --dry-run   # list what would train

Each run is ``train.py CONFIG OVERRIDES`` (wall time from start to exit, compilation
included), trained by the process pool of ``python -m tfmjax.sweep`` on the 2-core CPU,
``--jobs`` at once, each pinned to a core (see ``experiments/sweep.py``); its result is a
small JSON file in ``experiments/results/attention/`` keyed by a hash of the config (its
fields not at their defaults: a field added at its default changes no key), so a rerun
only trains what is missing or whose config changed, and the sweep can be spread over
sittings.
MLA's latent width is chosen so that its parameter count matches softmax attention's (the
table shows both counts); linear attention and the sparse patterns have the same
projections as softmax attention; the recurrent mixers (retention, selective scan) have
their own, so their parameter counts differ.
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
    train_missing,
    train_options,
    write_table,
)
from sweep import parser as sweep_parser  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "attention"
TASKS = {
    "reverse": "configs/reverse_decoder.toml",
    "shakespeare_char": "configs/shakespeare_char.toml",
}
# Per task: the overrides of each attention system. MLA's kv_rank equalises parameters:
# reverse (tiny-gpt2 width 64, biases): 8,320 + 194 R = 16,640 -> R = 43; shakespeare_char
# (width 128, no biases): 32,768 + 385 R = 65,536 -> R = 85.
VARIANTS = {
    "softmax": {"reverse": [], "shakespeare_char": []},
    "mla": {
        "reverse": ["model.attention=mla", "model.kv_rank=43"],
        "shakespeare_char": ["model.attention=mla", "model.kv_rank=85"],
    },
    "linear_elu": {
        "reverse": ["model.attention=linear", "model.feature_map=elu"],
        "shakespeare_char": ["model.attention=linear", "model.feature_map=elu"],
    },
    "linear_favor": {
        "reverse": ["model.attention=linear", "model.feature_map=favor", "model.num_features=64"],
        "shakespeare_char": [
            "model.attention=linear",
            "model.feature_map=favor",
            "model.num_features=64",
        ],
    },
    "strided": {  # Sparse Transformer: stride about sqrt(length)
        "reverse": ["model.attention_stride=5"],
        "shakespeare_char": ["model.attention_stride=8"],
    },
    "window_global": {  # Longformer: a local window and a few global positions
        "reverse": ["model.window=4", "model.global_tokens=4"],
        "shakespeare_char": ["model.window=8", "model.global_tokens=4"],
    },
    "bigbird": {  # BigBird: window and global positions as above, plus random key blocks
        "reverse": ["model.window=4", "model.global_tokens=4", "model.random_blocks=1"]
        + ["model.random_block_size=4"],
        "shakespeare_char": ["model.window=8", "model.global_tokens=4", "model.random_blocks=2"]
        + ["model.random_block_size=16"],
    },
    # The recurrent mixers (their own projections: the table shows their parameter counts)
    "retention": {  # RetNet: multi-scale exponential decay, group norm, swish gate
        "reverse": ["model.attention=retention"],
        "shakespeare_char": ["model.attention=retention"],
    },
    "selective_scan": {  # Mamba-style: input-dependent decay, causal conv, associative scan
        "reverse": ["model.attention=selective_scan"],
        "shakespeare_char": ["model.attention=selective_scan"],
    },
}
BEGIN, END = "<!-- attention-systems-table -->", "<!-- /attention-systems-table -->"


def result_path(task: str, variant: str) -> Path:
    return RESULTS / f"{task}-{variant}.json"


def run_of(task: str, variant: str, extra: list[str], root: Path) -> Run:
    """The run of one (task, variant), its workdir under ``root``."""
    overrides = (*VARIANTS[variant][task], *extra)
    label = f"{task} with {variant}"
    return Run("attention", f"{task}-{variant}", label, TASKS[task], overrides, root)


def pending(tasks, variants, extra: list[str]) -> list[tuple[str, str]]:
    """The (task, variant) pairs with no result, or a result of another config."""
    return [
        (task, variant)
        for task in tasks
        for variant in variants
        if not is_current(result_path(task, variant), TASKS[task], VARIANTS[variant][task] + extra)
    ]


def table(tasks, variants) -> str:
    """The markdown table of the stored results (missing ones shown as such)."""
    lines = [
        "| task | attention | parameters | result | wall |",
        "| --- | --- | ---: | --- | ---: |",
    ]
    for task in tasks:
        for variant in variants:
            path = result_path(task, variant)
            if not path.is_file():
                lines.append(f"| `{task}` | {variant} | | not run | |")
                continue
            r = json.loads(path.read_text())
            if r.get("diverged_at"):
                where = f"diverged (non-finite loss) at step {r['diverged_at']}"
                if "loss" in r:
                    where += f"; last eval, step {r['step']}: loss {r['loss']:.3f}"
                lines.append(
                    f"| `{task}` | {variant} | {r['params']:,} | {where} | {r['wall_sec']:.0f} s |"
                )
                continue
            if task == "shakespeare_char":
                result = f"val loss {r['loss']:.3f} ({r['bits_per_char']:.3f} bits/char)"
            else:
                result = f"exact-match {r['exact_match']:.3f}"
            lines.append(
                f"| `{task}` | {variant} | {r['params']:,} | {result} at step {r['step']} "
                f"| {r['wall_sec']:.0f} s |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, sorted(TASKS))
    parser.add_argument("--variants", help="comma-separated subset of " + ", ".join(VARIANTS))
    args = parser.parse_args(argv)
    global RESULTS
    if args.results:
        RESULTS = Path(args.results)
    tasks = args.only or list(TASKS)
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; variants: {', '.join(VARIANTS)}")
    root = runs_dir(args.results)
    runs = {run_of(*pair, args.extra, root): pair for pair in pending(tasks, variants, args.extra)}

    def store(run: Run, record: dict) -> None:
        task, variant = runs[run]
        save(result_path(task, variant), {"task": task, "variant": variant, **record})
        print(f"  {run.label}: {record['wall_sec']:.0f} s, step {record['step']}", flush=True)

    code = train_missing(list(runs), store, **train_options(args))
    print(table(tasks, variants))
    if args.table and not args.dry_run:
        write_table(BEGIN, END, table(list(TASKS), list(VARIANTS)))
    return code


if __name__ == "__main__":
    sys.exit(main())
