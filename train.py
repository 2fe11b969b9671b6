"""Train a model on a toy task: ``python train.py CONFIG.toml [section.key=value ...]``.

Running it again on the same workdir resumes from the newest good checkpoint; changes of
train.steps and of the log/eval/checkpoint intervals apply, any other change of the config
is refused unless --override-config is given.
SIGTERM / Ctrl-C, at any moment: once a step has run, the current step finishes, is saved
and the exit is 0; before that, nothing is saved and the exit is 130 (SIGINT) or 143
(SIGTERM). A second Ctrl-C exits 130 at once (an unfinished checkpoint is discarded).
Exit 2: bad config or checkpoint; exit 1: non-finite loss (nothing saved after it).
Many processes (one per host, or several on one machine): run the same command in each,
with ``--coordinator HOST:PORT --num-processes N --process-id I``; only process 0 prints,
logs and plots; exit 3: a peer process was lost (rerun them all to resume).
"""

import argparse
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _FirstSignals:
    """Installed before the heavy imports: a signal there only sets a flag (checked once they
    are done, by the loop's StopSignals, which takes over); a second Ctrl-C exits at once."""

    def __init__(self):
        self.requested: str | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            os.write(2, b"second Ctrl-C: exiting now; nothing new was saved\n")
            os._exit(130)
        self.requested = self.requested or signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def main(argv=None) -> int:
    with _FirstSignals() as first:
        return _main(argv, first)


def _main(argv, first: _FirstSignals) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="experiment TOML, e.g. configs/reverse.toml")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.steps=500")
    parser.add_argument(
        "--progress",
        choices=("auto", "bar", "lines"),
        default="auto",
        help="tqdm bar or plain lines (auto: a bar on a TTY)",
    )
    parser.add_argument(
        "--override-config",
        action="store_true",
        help="resume even though the config differs from the checkpoint's in more than the "
        "resumable keys (train.steps, intervals, ...); the new config is recorded",
    )
    from tfmjax.checkpoint import data_origin
    from tfmjax.parallel import processes

    data_origin.add_argument(parser)
    processes.add_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    return processes.run_joined(args, lambda: _train(args, first))


def _train(args, first: _FirstSignals) -> int:
    from tfmjax.checkpoint import CheckpointError
    from tfmjax.config import ConfigError, load
    from tfmjax.parallel.processes import fail, is_main, tag
    from tfmjax.train.loop import EvaluationError, NonFiniteLossError, train
    from tfmjax.train.stopping import Interrupted, StopSignals

    # train() shares it: a signal from here on reaches the loop; a second Ctrl-C exits 130
    with StopSignals(exit_on_second=True) as stop:
        stop.take(first.requested)
        try:
            if stop.requested:
                raise Interrupted(stop.requested)
            experiment = load(args.config, args.overrides)
            progress = {"auto": None, "bar": True, "lines": False}[args.progress]
            result = train(
                experiment,
                progress=progress,
                override_config=args.override_config,
                accept_changed_data=args.accept_changed_data,
            )
        except Interrupted as err:
            print(f"{tag()}{err}", file=sys.stderr)
            return err.exit_code
        except (ConfigError, CheckpointError) as err:
            return fail(f"{tag()}error: {err}", 2)  # after a lost peer's line, if one was lost
        except (NonFiniteLossError, EvaluationError) as err:
            print(f"{tag()}error: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # not expected (the handlers above never raise it)
            print("interrupted", file=sys.stderr)
            return 130
    if result["stopped"] or not is_main():
        return 0  # the loop printed what it saved; only process 0 prints
    ev = result["eval"] or {}
    summary = f"step {result['step']}"
    if ev:
        shown = [k for k in ("exact_match", "bits_per_char", "token_accuracy") if k in ev][:1]
        summary += "".join(f"; eval {k} {ev[k]:.4f}" for k in shown) + f", loss {ev['loss']:.4f}"
    print(f"done: {summary}; workdir {result['workdir']}")
    return 0


if __name__ == "__main__":
    code = main()
    for sig in SIGNALS:  # done (saved, or nothing to save): a late signal changes nothing
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)
