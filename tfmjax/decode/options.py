"""Command-line decoding options shared by ``eval.py`` and ``python -m tfmjax.generate``.

``--decode greedy|beam|sample`` picks the family of strategy; ``sample`` is temperature
sampling, restricted to the top k (``--top-k``) or to the nucleus (``--top-p``) when given.
"""
from __future__ import annotations

import argparse

from tfmjax.decode.strategies import BeamSearch, Greedy, Temperature, TopK, TopP

DECODE_CHOICES = ("greedy", "beam", "sample")


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--decode``, ``--beam-size``, ``--alpha``, ``--temperature``, ``--top-k``,
    ``--top-p`` and ``--seed`` to ``parser``."""
    group = parser.add_argument_group("decoding")
    group.add_argument("--decode", default="greedy", choices=DECODE_CHOICES,
                       help="greedy (default), beam search, or sampling")
    group.add_argument("--beam-size", type=int, default=4, help="beam: hypotheses kept")
    group.add_argument("--alpha", type=float, default=0.6, help="beam: GNMT length penalty")
    group.add_argument("--temperature", type=float, default=1.0, help="sample: temperature")
    group.add_argument("--top-k", type=int, default=None, help="sample: only the k most likely")
    group.add_argument("--top-p", type=float, default=None, help="sample: only the nucleus p")
    group.add_argument("--seed", type=int, default=0, help="sample: random seed")


def strategy_from_args(args: argparse.Namespace):
    """The strategy the options name. Raises ValueError (one line) on a bad combination."""
    if args.decode == "greedy":
        return Greedy()
    if args.decode == "beam":
        return BeamSearch(args.beam_size, args.alpha)
    if args.top_k is not None and args.top_p is not None:
        raise ValueError("--top-k and --top-p cannot be combined: pass one of them")
    if args.top_k is not None:
        return TopK(args.top_k, args.temperature)
    if args.top_p is not None:
        return TopP(args.top_p, args.temperature)
    return Temperature(args.temperature)

