"""Command-line decoding options shared by ``eval.py`` and ``python -m tfmjax.generate``.

``--decode greedy|beam|sample`` picks the family of strategy; ``sample`` is temperature
sampling, restricted to the top k (``--top-k``) or to the nucleus (``--top-p``) when given.
"""

from __future__ import annotations

import argparse

from tfmjax.decode.strategies import BeamSearch, Greedy, Temperature, TopK, TopP

DECODE_CHOICES = ("greedy", "beam", "sample")
BEAM_DEFAULTS = {"beam_size": 4, "alpha": 0.6}
# Options that only mean something for one --decode choice: giving them with another one is
# refused rather than silently ignored.
_ONLY_FOR = {
    "beam_size": "beam",
    "alpha": "beam",
    "temperature": "sample",
    "top_k": "sample",
    "top_p": "sample",
}


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--decode``, ``--beam-size``, ``--alpha``, ``--temperature``, ``--top-k``,
    ``--top-p`` and ``--seed`` to ``parser``."""
    group = parser.add_argument_group("decoding")
    group.add_argument(
        "--decode",
        default="greedy",
        choices=DECODE_CHOICES,
        help="greedy (default), beam search, or sampling",
    )
    group.add_argument(
        "--beam-size",
        type=int,
        default=None,
        help=f"beam: hypotheses kept (default {BEAM_DEFAULTS['beam_size']})",
    )
    group.add_argument(
        "--alpha",
        type=float,
        default=None,
        help=f"beam: GNMT length penalty (default {BEAM_DEFAULTS['alpha']})",
    )
    group.add_argument(
        "--temperature", type=float, default=None, help="sample: temperature (default 1.0)"
    )
    group.add_argument("--top-k", type=int, default=None, help="sample: only the k most likely")
    group.add_argument("--top-p", type=float, default=None, help="sample: only the nucleus p")
    group.add_argument("--seed", type=int, default=0, help="sample: random seed")


def strategy_from_args(args: argparse.Namespace):
    """The strategy the options name. Raises ValueError (one line) on a bad combination."""
    for name, decode in _ONLY_FOR.items():
        if getattr(args, name) is not None and args.decode != decode:
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} applies to --decode {decode} only (got --decode "
                f"{args.decode}): add --decode {decode} or drop {flag}"
            )
    if args.decode == "greedy":
        return Greedy()
    if args.decode == "beam":
        beam = {
            k: BEAM_DEFAULTS[k] if getattr(args, k) is None else getattr(args, k)
            for k in BEAM_DEFAULTS
        }
        return BeamSearch(**beam)
    temperature = 1.0 if args.temperature is None else args.temperature
    if args.top_k is not None and args.top_p is not None:
        raise ValueError("--top-k and --top-p cannot be combined: pass one of them")
    if args.top_k is not None:
        return TopK(args.top_k, temperature)
    if args.top_p is not None:
        return TopP(args.top_p, temperature)
    return Temperature(temperature)
