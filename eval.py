"""Evaluate a checkpoint: ``python eval.py CHECKPOINT [mesh.KEY=VALUE ...] [--split eval|length]``.

Answers are decoded with the KV-cached ``tfmjax.decode.generate``: ``--decode greedy``
(default), ``beam`` (``--beam-size``, ``--alpha``) or ``sample`` (``--temperature``, and
``--top-k`` or ``--top-p``; ``--seed``). The config is read from the checkpoint. Prints a
table and writes ``eval/step_N.json`` into the workdir (and ``eval.json``, the report of the
newest step evaluated). Exit 2 (one line on stderr) for a missing or
incompatible checkpoint. An imported Hugging Face language model has no task to score:
``--text FILE`` gives its perplexity (and bits per character) on a text file, encoded with
its own tokenizer (report ``eval/step_N_text.json``). Ctrl-C / SIGTERM: one line, exit
130 / 143 (no report is ever half-written).
Mesh: the params are restored directly onto a device mesh, each device reading only its
own shards, and evaluated there as the training loop does; by default the checkpoint's own
mesh fitted to the devices present (``data=2 x fsdp=2 x tensor=2`` on one device runs on
one device; one line on stderr names the mesh whenever it is not the checkpoint's own).
``mesh.data``, ``mesh.fsdp``, ``mesh.tensor`` and ``mesh.rules`` overrides, as ``train.py``
takes them, apply on top of the checkpoint's ``[mesh]`` and are used as given (not fitted),
e.g. ``mesh.data=1 mesh.fsdp=-1 mesh.tensor=1`` (FSDP over every device).
Many processes: the same flags as ``train.py`` (``--coordinator``, ``--num-processes``,
``--process-id``); the mesh spans every process's devices, and process 0 alone prints and
writes the report.
"""

import argparse
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Interrupts:
    """Ctrl-C / SIGTERM, from the first line on: one line and exit 130 / 143 at once.

    Exits from the handler (``os._exit``) instead of raising KeyboardInterrupt inside jax,
    which can crash the interpreter during a compile; nothing is written before the report,
    and the report is written with the signals held back (:meth:`held`).
    """

    def __init__(self):
        self.holding, self.pending, self.written = False, None, False
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        if self.holding:
            self.pending = self.pending or signum
            return
        done = "the report was written" if self.written else "no report written"
        os.write(2, f"{signal.Signals(signum).name}: interrupted; {done}\n".encode())
        os._exit(128 + signum)

    def held(self, write, *args):
        """``write(*args)`` with the signals held back; a signal that came exits after it."""
        self.holding = True
        try:
            result = write(*args)
            self.written = True
            return result
        finally:
            self.holding = False
            if self.pending:
                self._handle(self.pending, None)


def main(argv=None) -> int:
    with _Interrupts() as interrupts:
        return _main(argv, interrupts)


def _main(argv, interrupts: _Interrupts) -> int:
    from tfmjax.checkpoint import data_origin
    from tfmjax.decode.options import add_decode_arguments
    from tfmjax.parallel import processes

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("path", help="a workdir (runs/NAME), its checkpoints/ dir or one step dir")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="mesh.KEY=VALUE: the mesh to evaluate on, e.g. mesh.fsdp=-1 (default: the "
        "checkpoint's mesh, fitted to the devices present)",
    )
    parser.add_argument("--split", default="eval", choices=("eval", "length"))
    parser.add_argument(
        "--text",
        default=None,
        metavar="FILE",
        help="an imported language model (python -m tfmjax.hf import): its perplexity on "
        "this UTF-8 text file, encoded with the model's own tokenizer",
    )
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
    data_origin.add_argument(parser)
    processes.add_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    for name in ("num_examples", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"error: --{name.replace('_', '-')}={value} must be >= 1", file=sys.stderr)
            return 2

    return processes.run_joined(args, lambda: _evaluate(args, interrupts))


def _evaluate(args, interrupts: _Interrupts) -> int:
    from tfmjax.checkpoint import CheckpointError
    from tfmjax.config import ConfigError
    from tfmjax.decode.options import strategy_from_args
    from tfmjax.evaluation.report import evaluate_checkpoint, format_report, write_report
    from tfmjax.parallel.processes import fail, is_main, tag

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
            mesh=args.overrides,
            say=lambda line: is_main() and print(line, file=sys.stderr, flush=True),
            text=args.text,
            accept_changed_data=args.accept_changed_data,
        )
    except (CheckpointError, ConfigError, ValueError) as err:
        return fail(f"{tag()}error: {err}", 2)  # after a lost peer's line, if one was lost
    if not is_main():
        return 0  # process 0 writes and prints the report
    written = interrupts.held(write_report, report, args.out)
    print(format_report(report))
    print(f"wrote {', '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
