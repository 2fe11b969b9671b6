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

from tfmjax.config import load  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "attention"
TASKS = {
    "reverse": "configs/reverse_decoder.toml",
    "associative_recall": "configs/associative_recall_decoder.toml",
    "induction_head": "configs/induction_head_decoder.toml",
    "shakespeare_char": "configs/shakespeare_char.toml",
}
# The toy tasks' sequences are 15-22 tokens long and share the sparse patterns' sizes;
# shakespeare_char's are 64.
TOY = ("reverse", "associative_recall", "induction_head")
# MLA's kv_rank equalises parameters with softmax attention (searched over R with
# tfmjax.summary.count_params): reverse (tiny-gpt2 width 64, biases) 110,336 against 110,380
# at R = 43; associative_recall (4 heads of 32) 137,344 / 137,104 at R = 60; induction_head
# 104,192 / 104,144 at R = 48; shakespeare_char (width 128, no biases) 32,768 + 385 R = 65,536
# per layer -> R = 85.
MLA_RANK = {"reverse": 43, "associative_recall": 60, "induction_head": 48, "shakespeare_char": 85}


def _uses_rope(task: str) -> bool:
    """The task's config uses RoPE, which the selective scan cannot take (its causal
    convolution and input-dependent decay carry order, as in Mamba): it runs such a task
    without positions."""
    return load(ROOT / TASKS[task]).model.position == "rope"


# Per variant: its overrides on the toy tasks and on shakespeare_char.
_VARIANTS = {
    "softmax": ([], []),
    "mla": (["model.attention=mla"], ["model.attention=mla"]),  # + the kv_rank above
    "linear_elu": (["model.attention=linear", "model.feature_map=elu"],) * 2,
    "linear_favor": (
        ["model.attention=linear", "model.feature_map=favor", "model.num_features=64"],
    )
    * 2,
    "strided": (  # Sparse Transformer: stride about sqrt(length)
        ["model.attention_stride=5"],
        ["model.attention_stride=8"],
    ),
    "window_global": (  # Longformer: a local window and a few global positions
        ["model.window=4", "model.global_tokens=4"],
        ["model.window=8", "model.global_tokens=4"],
    ),
    # BigBird: window and global positions as above, plus random key blocks. On the toy
    # tasks 2 blocks of 2 positions per query block: they add 8, 13 and 17 of the 28, 45 and
    # 91 causal pairs that the window and globals leave out at lengths 16, 18 and 22 (seed
    # 0); 1 block of 4 added 0, 1 and 6 (recall scored as window_global to the last digit).
    "bigbird": (
        ["model.window=4", "model.global_tokens=4", "model.random_blocks=2"]
        + ["model.random_block_size=2"],
        ["model.window=8", "model.global_tokens=4", "model.random_blocks=2"]
        + ["model.random_block_size=16"],
    ),
    # The recurrent mixers (their own projections: the table shows their parameter counts)
    # RetNet: multi-scale exponential decay, group norm, swish gate
    "retention": (["model.attention=retention"],) * 2,
    # Mamba-style: input-dependent decay, causal conv, associative scan
    "selective_scan": (["model.attention=selective_scan"],) * 2,
}
VARIANTS = {
    variant: {
        task: list(toy if task in TOY else text)
        + ([f"model.kv_rank={MLA_RANK[task]}"] if variant == "mla" else [])
        + (["model.position=none"] if variant == "selective_scan" and _uses_rope(task) else [])
        for task in TASKS
    }
    for variant, (toy, text) in _VARIANTS.items()
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
