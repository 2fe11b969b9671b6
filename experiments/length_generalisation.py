"""Train short, test long: each position encoding on copy, reverse and (reversed-digit)
addition, evaluated at 1x, 1.5x, 2x and 4x the longest training length, both families.

    python experiments/length_generalisation.py           # run what is missing, print the table
    python experiments/length_generalisation.py --table  # ... and rewrite docs/studies.md + PNG
    python experiments/length_generalisation.py --only copy --encodings rope,alibi --seeds 0
    python experiments/length_generalisation.py --jobs 2 --budget 3600   # 2 runs at once, 1 h
    python experiments/length_generalisation.py --budget 0 --table   # the table, train nothing

Training lengths: copy and reverse 1-8 symbols (tested at 8, 12, 16, 32), addition operands
of 1-4 digits (tested with exactly 4, 6, 8, 16 digits; ``addition_reversed`` writes every
number least significant first, McLeish et al.'s order). Encodings: sinusoidal, learned, RoPE,
ALiBi, T5 relative buckets, and none (decoder-only: a causal decoder can count positions
itself; an encoder without positions cannot tell orders apart); FIRE; Abacus places (on
copy and reverse the 10 symbols are the "digits", a sequence one number); ``abacus_end``
(encoder-decoder, reverse: the encoder counts each number from its end, so a source symbol's
place is the place of the answer symbol it becomes: position coupling, Cho et al. 2024); and
``randomized_X``: encoding X trained on sorted random positions below
``MAX_POSITION`` (Ruoss et al. 2023; docs/length_generalisation.md); ``randomized_abacus``:
Abacus places that take a sorted random subset of a window twice a number's length while
training, in place of a contiguous run at a random offset. Every model has
``max_len = 72`` positions, so learned positions past the training lengths exist but were
never trained (unless randomized). Each run trains with ``train.py`` in the process pool of
``python -m tfmjax.sweep`` (``--jobs`` at once, each pinned to a core; see
``experiments/sweep.py``); as each one ends, its checkpoint is scored in this process with
greedy decoding on 256 eval-split examples per length; the result is
``experiments/results/length/TASK-FAMILY-ENCODING-seedS.json``, keyed by a hash of the
config and the evaluation, so the study can span sittings.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep import (  # noqa: E402
    ROOT,
    Run,
    config_hash,
    runs_dir,
    save,
    train_missing,
    train_options,
    write_table,
)
from sweep import parser as sweep_parser  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "length"
FIGURE = ROOT / "docs" / "length_generalisation.png"
FAMILIES = {"decoder_only": "_decoder", "encoder_decoder": ""}
BASE_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "relative")
ENCODINGS = (
    *BASE_ENCODINGS,
    "none",
    "fire",
    "abacus",
    "abacus_end",
    *(f"randomized_{e}" for e in BASE_ENCODINGS),
    "randomized_abacus",
)
FACTORS = (1.0, 1.5, 2.0, 4.0)
SEEDS = (0, 1, 2)
MAX_LEN = 72  # holds a decoder-only copy of 4 x 8 symbols: 32 + SEP + 32 + EOS
MAX_POSITION = 256  # randomized positions are drawn below this
# Abacus's training offsets are drawn in [0, ABACUS_MAX_OFFSET[task]): the longest training
# number's places plus the offset reach the places of a 4x test. Addition: up to 5 places (a
# 4-digit sum) + 13 >= the 17 of a sum at 4x (the paper sets its k = 100 for its own test
# lengths; at 100 each place row trains in about 4% of rows and a 4000-step run learned
# 4-digit reversed addition to 0.04 exact-match, at 14 to 1.00 on seed 0 and 0.10 on seed 1).
# Copy and reverse: 8 symbols + 24 >= 32 (docs/length_generalisation.md).
ABACUS_MAX_OFFSET = {"copy": 25, "reverse": 25, "addition": 14, "addition_reversed": 14}
# FIRE and Abacus places on copy and reverse train longer than the tasks' 1000-1500 steps:
# a decoder-only Abacus copy (seed 0) reached exact-match 0.18 / 0.00 at 1.5x / 2x after
# 1000 steps, 0.96 / 0.46 after 3000 and 0.99 / 0.91 after 6000 (about 3 minutes on one
# core); FIRE on reverse (encoder-decoder, seed 0) 0.77 / 0.08 after 1500, 0.965 / 0.79 after
# 4000 and 0.977 / 0.88 after 8000. The other encodings keep the tasks' budgets.
LONG_STEPS = {"copy": 6000, "reverse": 6000}
LONG_ENCODINGS = ("fire", "abacus", "abacus_end", "randomized_abacus")
EVAL_EXAMPLES = 256
# Per task: the training lengths (task params), the length parameter and its training
# maximum, and per family the overrides that keep a run near one minute on one core. The
# decoder-only family learns 4-digit reversed addition more slowly (at batch 64 x 3000 steps
# exact-match at 1x was 0.00-1.00 over encodings; batch 128 x 2500 steps, T5 buckets: 0.79),
# so it trains 4000 steps of batch 128 (T5 buckets: 0.93, ~3.5 minutes).
TASKS = {
    "copy": {"params": {"min_len": 1, "max_len": 8}, "length": "max_len", "train": {}},
    "reverse": {"params": {"min_len": 1, "max_len": 8}, "length": "max_len", "train": {}},
    "addition": {
        "params": {"num_digits": 4},
        "length": "num_digits",
        "train": {
            "encoder_decoder": ["data.batch_size=64", "train.steps=3000"],
            "decoder_only": ["data.batch_size=128", "train.steps=4000"],
        },
    },
    "addition_reversed": {  # every number least significant first (McLeish et al.'s order)
        "params": {"num_digits": 4, "reversed_operands": True},
        "length": "num_digits",
        "train": {
            "encoder_decoder": ["data.batch_size=64", "train.steps=3000"],
            "decoder_only": ["data.batch_size=128", "train.steps=4000"],
        },
    },
}
BEGIN, END = "<!-- length-table -->", "<!-- /length-table -->"


def applies(task: str, family: str, encoding: str) -> bool:
    """No positions: decoder-only only; Abacus places counted from a number's end: the
    encoder-decoder on reverse (where they line a source symbol up with its answer symbol)."""
    if encoding == "none" and family == "encoder_decoder":
        return False
    return encoding != "abacus_end" or (task, family) == ("reverse", "encoder_decoder")


def runs(tasks, families, encodings, seeds):
    """Every (task, family, encoding, seed) of the study that :func:`applies`."""
    return [
        (task, family, encoding, seed)
        for task in tasks
        for family in families
        for encoding in encodings
        if applies(task, family, encoding)
        for seed in seeds
    ]


def encoding_overrides(encoding: str, task: str) -> list[str]:
    """The overrides of a study encoding name: its model fields, and for FIRE and Abacus on
    copy and reverse the longer training (:data:`LONG_STEPS`)."""
    long = encoding in LONG_ENCODINGS and task in LONG_STEPS
    steps = [f"train.steps={LONG_STEPS[task]}"] if long else []
    return [*model_overrides(encoding, task), *steps]


def model_overrides(encoding: str, task: str) -> list[str]:
    """The model fields of a study encoding name."""
    if encoding in ("abacus", "abacus_end", "randomized_abacus"):
        count_from = ["model.abacus_count_from=end"] if encoding == "abacus_end" else []
        sampling = ["model.position_sampling=randomized"] if encoding.startswith("rand") else []
        return [
            "model.position=abacus",
            "model.digit_first_id=5",
            f"model.abacus_max_offset={ABACUS_MAX_OFFSET[task]}",
            *count_from,
            *sampling,
        ]
    if encoding.startswith("randomized_"):
        base = encoding.removeprefix("randomized_")
        return [
            f"model.position={base}",
            "model.position_sampling=randomized",
            f"model.max_position={MAX_POSITION}",
        ]
    return [f"model.position={encoding}"]


def config_of(task: str, family: str) -> str:
    return f"configs/{task}{FAMILIES[family]}.toml"


def overrides(task: str, family: str, encoding: str, seed: int, extra: list[str]) -> list[str]:
    spec = TASKS[task]
    value = lambda v: str(v).lower() if isinstance(v, bool) else v  # TOML bools
    params = [f"data.task_params.{k}={value(v)}" for k, v in spec["params"].items()]
    return [
        *encoding_overrides(encoding, task),
        f"model.max_len={MAX_LEN}",
        *params,
        *spec["train"].get(family, []),
        f"train.seed={seed}",
        *extra,
    ]


def lengths_of(task: str) -> list[int]:
    longest = TASKS[task]["params"][TASKS[task]["length"]]
    return [int(round(f * longest)) for f in FACTORS]


def run_hash(task, family, encoding, seed, extra) -> str:
    config = config_hash(config_of(task, family), overrides(task, family, encoding, seed, extra))
    key = {
        "config": config,
        "lengths": lengths_of(task),
        "examples": EVAL_EXAMPLES,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def result_path(task, family, encoding, seed) -> Path:
    return RESULTS / f"{task}-{family}-{encoding}-seed{seed}.json"


def is_current(run, extra) -> bool:
    path = result_path(*run)
    return path.is_file() and json.loads(path.read_text())["hash"] == run_hash(*run, extra)


def task_at(task: str, n: int):
    """The task with every example at length ``n`` (symbols, or digits per operand)."""
    from tfmjax.data.tasks import make_task

    params = {k: v for k, v in TASKS[task]["params"].items() if k not in ("min_len", "max_len")}
    if TASKS[task]["length"] == "num_digits":
        return make_task(task, **{**params, "num_digits": n}, exact_digits=True)
    return make_task(task, **params, min_len=n, max_len=n)


def score(workdir: Path, task: str) -> list[dict]:
    """Greedy exact-match and token accuracy of the checkpoint at each test length."""
    from tfmjax.checkpoint import load_for_inference
    from tfmjax.config import from_dict
    from tfmjax.evaluation.evaluator import Evaluator

    config, params, _ = load_for_inference(workdir)
    model_config = from_dict(config).model
    out = []
    for n in lengths_of(task):
        evaluator = Evaluator(
            model_config, task_at(task, n), batch_size=64, num_examples=EVAL_EXAMPLES
        )
        metrics, _ = evaluator(params)
        out.append(
            {
                "length": n,
                "exact_match": round(float(metrics["exact_match"]), 4),
                "token_accuracy": round(float(metrics["token_accuracy"]), 4),
            }
        )
    return out


def run_of(task, family, encoding, seed, extra, root: Path) -> Run:
    """The training run of one (task, family, encoding, seed), its workdir under ``root``."""
    return Run(
        "length",
        f"{task}-{family}-{encoding}-seed{seed}",
        f"{task} {family} {encoding} {seed}",
        config_of(task, family),
        tuple(overrides(task, family, encoding, seed, extra)),
        root,
    )


def scored(run: Run, record: dict, task, family, encoding, seed, extra) -> dict:
    """The study's result: ``run``'s training ``record`` (without its curve) and the scores
    of its checkpoint at each test length."""
    record = {k: v for k, v in record.items() if k != "curve"}
    start = time.perf_counter()
    scores = score(run.workdir, task)
    return {
        "task": task,
        "family": family,
        "encoding": encoding,
        "seed": seed,
        "hash": run_hash(task, family, encoding, seed, extra),
        "train": record,
        "scores": scores,
        "score_sec": round(time.perf_counter() - start, 1),
    }


def _mean_scores(task, family, encoding, seeds, metric: str, extra=()):
    """``(per-length means, number of seeds)`` of the stored results that are current (a
    result of an older setting, e.g. before the 4x length, is left out: it is rerun)."""
    rows = [
        json.loads(result_path(task, family, encoding, s).read_text())
        for s in seeds
        if is_current((task, family, encoding, s), list(extra))
    ]
    if not rows:
        return None, 0
    values = np.array([[point[metric] for point in r["scores"]] for r in rows])
    return values.mean(axis=0), len(rows)


def table(tasks, families, encodings, seeds, extra=()) -> str:
    head = " / ".join(f"{f:g}x" for f in FACTORS)
    lines = [
        f"| task | family | encoding | seeds | exact-match ({head}) | token accuracy ({head}) |",
        "| --- | --- | --- | ---: | --- | --- |",
    ]
    for task in tasks:
        for family in families:
            for encoding in encodings:
                if not applies(task, family, encoding):
                    continue
                em, n = _mean_scores(task, family, encoding, seeds, "exact_match", extra)
                if em is None:
                    lines.append(f"| `{task}` | {family} | {encoding} | 0 | not run | |")
                    continue
                acc, _ = _mean_scores(task, family, encoding, seeds, "token_accuracy", extra)
                fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)
                lines.append(f"| `{task}` | {family} | {encoding} | {n} | {fmt(em)} | {fmt(acc)} |")
    return "\n".join(lines)


def line_style(encoding: str) -> dict:
    """One look per encoding in every panel: a colour per base scheme (an encoding missing
    from a panel does not shift the others' colours), dashed with open markers when randomized."""
    base = encoding.removeprefix("randomized_")
    bases = [e for e in ENCODINGS if not e.startswith("randomized_")]
    style = {"color": f"C{bases.index(base)}", "marker": "o", "label": encoding}
    if base != encoding:
        style |= {"linestyle": "--", "markerfacecolor": "none"}
    return style


def figure(tasks, families, encodings, seeds, path: Path, extra=()) -> None:
    """Exact-match against test length, one panel per task x family, a line per encoding."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(tasks) + 2.0, 3.2 * len(families)), layout="constrained")
    axes = fig.subplots(len(families), len(tasks), squeeze=False)
    legend = {}  # label -> line, over every panel (abacus_end is drawn in one only)
    for row, family in enumerate(families):
        for col, task in enumerate(tasks):
            ax = axes[row][col]
            for encoding in encodings:
                em, n = _mean_scores(task, family, encoding, seeds, "exact_match", extra)
                if em is not None:
                    (legend[encoding],) = ax.plot(lengths_of(task), em, **line_style(encoding))
            ax.set_title(f"{task}, {family}", fontsize="medium")
            ax.set_xticks(lengths_of(task))
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("test length (training max = first tick)")
            ax.set_ylabel("exact-match")
            ax.grid(alpha=0.3)
    if legend:
        order = [e for e in encodings if e in legend]
        fig.legend([legend[e] for e in order], order, loc="outside right upper", fontsize="small")
    FigureCanvasAgg(fig).print_png(str(path))


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, TASKS)
    parser.add_argument("--families", help="comma-separated subset of " + ", ".join(FAMILIES))
    parser.add_argument("--encodings", help="comma-separated subset of " + ", ".join(ENCODINGS))
    parser.add_argument("--seeds", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--figure", help="where the PNG goes (default docs/)")
    args = parser.parse_args(argv)
    global RESULTS
    if args.results:
        RESULTS = Path(args.results)
    tasks = args.only or list(TASKS)
    families = args.families.split(",") if args.families else list(FAMILIES)
    encodings = args.encodings.split(",") if args.encodings else list(ENCODINGS)
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    for name, chosen, known in (("family", families, FAMILIES), ("encoding", encodings, ENCODINGS)):
        bad = [c for c in chosen if c not in known]
        if bad:
            parser.error(f"unknown {name} {bad[0]!r}; choose from {', '.join(known)}")
    missing = [r for r in runs(tasks, families, encodings, seeds) if not is_current(r, args.extra)]
    root = runs_dir(args.results)
    by_run = {run_of(*key, args.extra, root): key for key in missing}

    def store(run: Run, record: dict) -> None:
        key = by_run[run]
        result = scored(run, record, *key, args.extra)
        save(result_path(*key), result)
        em = " ".join(f"{p['exact_match']:.2f}" for p in result["scores"])
        print(f"  {run.label}: exact-match {em}; {record['wall_sec']:.0f} s", flush=True)

    code = train_missing(list(by_run), store, **train_options(args))
    print(table(tasks, families, encodings, seeds, args.extra))
    if args.dry_run:
        return code
    if args.table or args.figure:
        path = Path(args.figure) if args.figure else FIGURE
        figure(tasks, families, encodings, seeds, path, args.extra)
    if args.table:
        write_table(BEGIN, END, table(list(TASKS), list(FAMILIES), ENCODINGS, SEEDS))
    return code


if __name__ == "__main__":
    sys.exit(main())
