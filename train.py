"""Train a model on a toy task: ``python train.py CONFIG.toml [section.key=value ...]``.

Running it again on the same workdir resumes from the newest good checkpoint; changes of
train.steps and of the log/eval/checkpoint intervals apply, any other change of the config
is refused unless --override-config is given.
SIGTERM / Ctrl-C save the current step and exit 0. Exit 2: bad config or checkpoint;
exit 1: non-finite loss (nothing saved after it).
"""

import argparse
import sys


def main(argv=None) -> int:
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
    args = parser.parse_args(argv)

    from tfmjax.checkpoint import CheckpointError
    from tfmjax.config import ConfigError, load
    from tfmjax.train.loop import NonFiniteLossError, train

    try:
        experiment = load(args.config, args.overrides)
        progress = {"auto": None, "bar": True, "lines": False}[args.progress]
        result = train(experiment, progress=progress, override_config=args.override_config)
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    ev = result["eval"] or {}
    summary = f"step {result['step']}" + (" (stopped)" if result["stopped"] else "")
    if ev:
        summary += f"; eval exact_match {ev['exact_match']:.4f}, loss {ev['loss']:.4f}"
    print(f"done: {summary}; workdir {result['workdir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
