"""Train every attention system on the same tasks and tabulate them against softmax attention.

    python experiments/attention_systems.py            # run what is missing, print the table
    python experiments/attention_systems.py --table   # ... and rewrite its table in docs/studies.md
    python experiments/attention_systems.py --budget 0 --table   # rewrite it, train nothing
    python experiments/attention_systems.py --only reverse --variants softmax,mla
    python experiments/attention_systems.py --jobs 2 --dry-run   # list what would train
    python experiments/attention_systems.py --seeds 0 --only reverse   # one seed, one task

Each run is ``train.py CONFIG OVERRIDES`` (wall time from start to exit, compilation
included), trained by the process pool of ``python -m tfmjax.sweep`` on the 2-core CPU,
``--jobs`` at once, each pinned to a core (see ``experiments/sweep.py``); its result is a
small JSON file ``experiments/results/attention/TASK-VARIANT-seedS.json`` keyed by a hash
of the config (its fields not at their defaults: a field added at its default changes no
key), so a rerun only trains what is missing or whose config changed, and the sweep can be
spread over sittings. Each (task, variant) trains with seeds 0, 1 and 2 (``train.seed``:
initialisation, data order and dropout); the table gives the mean and the range over the
seeds stored, the figure (``docs/attention_systems.png``) every seed's result.
MLA's latent width is chosen so that its parameter count matches softmax attention's (the
table shows both counts); linear attention and the sparse patterns have the same
projections as softmax attention; the recurrent mixers (retention, selective scan, rwkv) have
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
    spread,
    train_missing,
    train_options,
    write_table,
)
from sweep import parser as sweep_parser  # noqa: E402

from tfmjax.config import load  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "attention"
FIGURE = ROOT / "docs" / "attention_systems.png"
SEEDS = (0, 1, 2)
TASKS = {
    "reverse": "configs/reverse_decoder.toml",
    "associative_recall": "configs/associative_recall_decoder.toml",
    "induction_head": "configs/induction_head_decoder.toml",
    "shakespeare_char": "configs/shakespeare_char.toml",
}
# Nystrom and Linformer attention have no causal form (a landmark averages a whole segment;
# a projected key mixes every position), so each is compared in an encoder against softmax
# in the same encoder: the toy tasks' encoder-decoder configs (the encoder reads the question
# whole; the decoder keeps softmax) and, for text, the masked-LM encoder on the same corpus
# (its validation loss is over masked characters, comparable only between these rows).
ENCODER_TASKS = {
    "reverse": "configs/reverse.toml",
    "associative_recall": "configs/associative_recall.toml",
    "induction_head": "configs/induction_head.toml",
    "shakespeare_char": "configs/shakespeare_mlm.toml",
}
ENCODER_VARIANTS = ("encoder_softmax", "encoder_nystrom", "encoder_linformer")
# The toy tasks' sequences are 15-22 tokens long and share the sparse patterns' sizes;
# shakespeare_char's are 64.
TOY = ("reverse", "associative_recall", "induction_head")
# MLA's kv_rank equalises parameters with softmax attention (searched over R with
# tfmjax.summary.count_params): reverse (tiny-gpt2 width 64, biases) 110,336 against 110,380
# at R = 43; associative_recall (4 heads of 32) 137,344 / 137,104 at R = 60; induction_head
# 104,192 / 104,144 at R = 48; shakespeare_char (width 128, no biases) 32,768 + 385 R = 65,536
# per layer -> R = 85.
MLA_RANK = {"reverse": 43, "associative_recall": 60, "induction_head": 48, "shakespeare_char": 85}


# The variants that cannot take RoPE: the selective scan (its causal convolution and
# input-dependent decay carry order, as in Mamba) and rwkv (token shift and decay, as in
# RWKV-4) run a RoPE task without positions.
NO_ROPE = ("selective_scan", "rwkv")


def _uses_rope(task: str) -> bool:
    """The task's config uses RoPE, which the :data:`NO_ROPE` variants cannot take."""
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
    # Reformer's LSH attention (shared QK: no key projection, so fewer parameters than
    # softmax). Toy rows are 15-22 tokens: 4 buckets (about 5 tokens each) and chunks of 8,
    # so a row is 2-3 chunks and the chunking is a real restriction (the cached decode that
    # evaluation runs is then the unchunked form, docs/reformer.md); 64-char text: 8 buckets
    # of about 8 and chunks of 16 (4 per row), the paper's chunk of about two buckets.
    "lsh": (
        ["model.attention=lsh", "model.lsh_buckets=4", "model.lsh_chunk=8"],
        ["model.attention=lsh", "model.lsh_buckets=8", "model.lsh_chunk=16"],
    ),
    # The recurrent mixers (their own projections: the table shows their parameter counts)
    # RetNet: multi-scale exponential decay, group norm, swish gate
    "retention": (["model.attention=retention"],) * 2,
    # Mamba-style: input-dependent decay, causal conv, associative scan
    "selective_scan": (["model.attention=selective_scan"],) * 2,
    # RWKV-4: token shift, learned per-channel decay, its channel-mix as the feed-forward
    # (squared ReLU, so the configs' GELU gives way to relu, which it squares)
    "rwkv": (["model.attention=rwkv", "model.activation=relu"],) * 2,
    # In the encoder (ENCODER_TASKS): softmax, and Nystrom with landmarks over segments of
    # about 5 tokens on the toy tasks (15-22 tokens) and 8 on text (64): a real
    # approximation, not M = T, which is exact
    "encoder_softmax": ([], []),
    "encoder_nystrom": (
        ["model.attention=nystrom", "model.num_landmarks=4"],
        ["model.attention=nystrom", "model.num_landmarks=8"],
    ),
    # Linformer (no causal form either: each projected key mixes every position), with as
    # many projected keys/values as Nystrom has landmarks: 4 on the toy tasks, 8 on text
    "encoder_linformer": (
        ["model.attention=linformer", "model.linformer_rank=4"],
        ["model.attention=linformer", "model.linformer_rank=8"],
    ),
}
VARIANTS = {
    variant: {
        task: list(toy if task in TOY else text)
        + ([f"model.kv_rank={MLA_RANK[task]}"] if variant == "mla" else [])
        + (["model.position=none"] if variant in NO_ROPE and _uses_rope(task) else [])
        for task in TASKS
    }
    for variant, (toy, text) in _VARIANTS.items()
}
BEGIN, END = "<!-- attention-systems-table -->", "<!-- /attention-systems-table -->"


def config_of(task: str, variant: str) -> str:
    """The config file a (task, variant) trains from."""
    return (ENCODER_TASKS if variant in ENCODER_VARIANTS else TASKS)[task]


def result_path(task: str, variant: str, seed: int) -> Path:
    return RESULTS / f"{task}-{variant}-seed{seed}.json"


def overrides_of(task: str, variant: str, seed: int, extra: list[str]) -> list[str]:
    return [*VARIANTS[variant][task], f"train.seed={seed}", *extra]


def run_of(task: str, variant: str, seed: int, extra: list[str], root: Path) -> Run:
    """The run of one (task, variant, seed), its workdir under ``root``."""
    label = f"{task} with {variant}, seed {seed}"
    name = f"{task}-{variant}-seed{seed}"
    overrides = tuple(overrides_of(task, variant, seed, extra))
    return Run("attention", name, label, config_of(task, variant), overrides, root)


def pending(tasks, variants, seeds, extra: list[str]) -> list[tuple[str, str, int]]:
    """The (task, variant, seed) runs with no result, or a result of another config."""
    return [
        (task, variant, seed)
        for seed in seeds
        for task in tasks
        for variant in variants
        if not is_current(
            result_path(task, variant, seed),
            config_of(task, variant),
            overrides_of(task, variant, seed, extra),
        )
    ]


def stored(task: str, variant: str, seeds, extra=()) -> list[dict]:
    """The current results of (task, variant), one per seed that has one."""
    return [
        json.loads(result_path(task, variant, seed).read_text())
        for seed in seeds
        if is_current(
            result_path(task, variant, seed),
            config_of(task, variant),
            overrides_of(task, variant, seed, list(extra)),
        )
    ]


def score(task: str, record: dict) -> float | None:
    """The quantity compared: validation loss on text, exact-match on the toy tasks; None for
    a run that diverged."""
    if record.get("diverged_at"):
        return None
    return record["loss"] if task == "shakespeare_char" else record["exact_match"]


def table(tasks, variants, seeds, extra=()) -> str:
    """The markdown table of the stored results: the mean over seeds, their range in
    brackets; a seed that diverged is counted apart (missing ones shown as such)."""
    lines = [
        "| task | attention | parameters | seeds | result: mean (range) | wall, mean |",
        "| --- | --- | ---: | ---: | --- | ---: |",
    ]
    for task in tasks:
        for variant in variants:
            records = stored(task, variant, seeds, extra)
            if not records:
                lines.append(f"| `{task}` | {variant} | | 0 | not run | |")
                continue
            finished = [r for r in records if score(task, r) is not None]
            scores = [score(task, r) for r in finished]
            parts = []
            if scores:
                metric = "val loss" if task == "shakespeare_char" else "exact-match"
                at = "/".join(str(s) for s in sorted({r["step"] for r in finished}))
                parts.append(f"{metric} {spread(scores)} at step {at}")
            diverged = [r["diverged_at"] for r in records if r not in finished]
            if diverged:
                steps_at = ", ".join(str(s) for s in diverged)
                parts.append(f"{len(diverged)} diverged (non-finite loss; step {steps_at})")
            wall = sum(r["wall_sec"] for r in records) / len(records)
            lines.append(
                f"| `{task}` | {variant} | {records[0]['params']:,} | {len(records)} "
                f"| {'; '.join(parts)} | {wall:.0f} s |"
            )
    return "\n".join(lines)


def figure(tasks, variants, seeds, path: Path, extra=()) -> None:
    """One panel per task: each variant's result per seed (dots) and their mean (a bar), the
    softmax mean as a dashed line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.0 * len(tasks), 3.6), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        every = []
        for x, variant in enumerate(variants):
            records = stored(task, variant, seeds, extra)
            scores = [s for s in (score(task, r) for r in records) if s is not None]
            every += scores
            if records and not scores:
                ax.annotate(
                    "diverged",
                    (x, 0.5),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    ha="center",
                    va="center",
                    fontsize="small",
                )
            if not scores:
                continue
            mean = sum(scores) / len(scores)
            ax.bar(x, mean, color="tab:blue" if variant == "softmax" else "tab:gray", alpha=0.6)
            ax.plot([x] * len(scores), scores, "k.", markersize=5)
            if variant == "softmax":
                ax.axhline(mean, color="tab:blue", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels(variants, rotation=60, ha="right", fontsize="small")
        text = task == "shakespeare_char"
        ax.set_ylabel("validation loss (lower is better)" if text else "exact-match")
        if text and every:
            ax.set_ylim(min(every) - 0.1, max(every) + 0.1)
        else:
            ax.set_ylim(0, 1.03)
        ax.set_title(task, fontsize="medium")
        ax.grid(axis="y", alpha=0.3)
    FigureCanvasAgg(fig).print_png(str(path))


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, sorted(TASKS))
    parser.add_argument("--variants", help="comma-separated subset of " + ", ".join(VARIANTS))
    parser.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--figure", help="also draw the chosen runs' figure to this PNG (--table redraws docs/'s)"
    )
    args = parser.parse_args(argv)
    global RESULTS
    if args.results:
        RESULTS = Path(args.results)
    tasks = args.only or list(TASKS)
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; variants: {', '.join(VARIANTS)}")
    try:
        seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, got {args.seeds!r}")
    root = runs_dir(args.results)
    runs = {
        run_of(*key, args.extra, root): key for key in pending(tasks, variants, seeds, args.extra)
    }

    def store(run: Run, record: dict) -> None:
        task, variant, seed = runs[run]
        save(
            result_path(task, variant, seed),
            {"task": task, "variant": variant, "seed": seed, **record},
        )
        print(f"  {run.label}: {record['wall_sec']:.0f} s, step {record['step']}", flush=True)

    code = train_missing(list(runs), store, **train_options(args))
    print(table(tasks, variants, seeds, args.extra))
    if args.dry_run:
        return code
    if args.figure:
        figure(tasks, variants, seeds, Path(args.figure), args.extra)
    if args.table:
        figure(list(TASKS), list(VARIANTS), SEEDS, FIGURE)
        write_table(BEGIN, END, table(list(TASKS), list(VARIANTS), SEEDS))
    return code


if __name__ == "__main__":
    sys.exit(main())
