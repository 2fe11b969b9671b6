"""Evaluate a checkpoint: ``python eval.py WORKDIR_OR_CHECKPOINT [--split eval|length]``.

Answers are decoded with the KV-cached ``tfmjax.decode.generate``: ``--decode greedy``
(default), ``beam`` (``--beam-size``, ``--alpha``) or ``sample`` (``--temperature``, and
``--top-k`` or ``--top-p``; ``--seed``). The config is read from the checkpoint. Prints a
table and writes ``eval/step_N.json`` into the workdir (and ``eval.json``, the report of the
newest step evaluated). Exit 2 (one line on stderr) for a missing or
incompatible checkpoint.
"""

import argparse
import sys

from tfmjax.decode.options import add_decode_arguments, strategy_from_args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a workdir (runs/NAME), its checkpoints/ dir or one step dir")
    parser.add_argument("--split", default="eval", choices=("eval", "length"))
    parser.add_argument(
        "--num-examples", type=int, default=None, help="default: data.eval_examples"
    )
    parser.add_argument("--batch-size", type=int, default=None, help="default: data.batch_size")
    parser.add_argument("--rows", type=int, default=5, help="example rows to show")
    parser.add_argument(
        "--out",
        default=None,
        help="report path (default: WORKDIR/eval/step_N.json, and WORKDIR/eval.json when N is "
        "the newest step evaluated)",
    )
    add_decode_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("num_examples", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"error: --{name.replace('_', '-')}={value} must be >= 1", file=sys.stderr)
            return 2

    from tfmjax.checkpoint import CheckpointError
    from tfmjax.config import ConfigError
    from tfmjax.evaluate import evaluate_checkpoint, format_report, write_report

    try:
        strategy = strategy_from_args(args)
        report = evaluate_checkpoint(
            args.path,
            split=args.split,
            num_examples=args.num_examples,
            batch_size=args.batch_size,
            num_rows=args.rows,
            strategy=strategy,
            decode_seed=args.seed,
        )
    except (CheckpointError, ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    written = write_report(report, args.out)
    print(format_report(report))
    print(f"wrote {', '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
