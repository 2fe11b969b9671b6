"""Time to first token for a new prompt length after the first call, in one run: prompt
widths in buckets (``generate``'s default) against a compile per width (``bucket=False``).

    python bench/first_token.py            # tiny-gpt2, batch 1, lengths 9 then 10..14

An interactive session: the first call (prompt length 9) compiles; each later call brings a
prompt length not seen before, with one new token (``max_new_tokens=1``: the time to the
first token) at a new temperature. Bucketed, lengths 9..14 (widths 10..15 with BOS) share
the width-16 program and temperature is traced: no compile after the first call. Unbucketed,
every new width compiles. Compiles are counted from jax's compile events; times are wall
seconds of one call (block_until_ready), the compile included where there is one.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from tfmjax.decode import Temperature, generate
from tfmjax.models import build, preset

_COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: (
        _COMPILES.append(secs) if event == "/jax/core/compile/backend_compile_duration" else None
    )
)


def session(model, params, lengths, bucket: bool):
    """``[(prompt length, seconds, compiles)]`` of one call per length."""
    rows = []
    for i, n in enumerate(lengths):
        prompt = [list(5 + np.arange(n) % 20)]
        before = len(_COMPILES)
        start = time.perf_counter()
        out = generate(model, params, prompt, Temperature(0.6 + 0.2 * i), 1, rng=i, bucket=bucket)
        jax.block_until_ready(out)
        rows.append((n, time.perf_counter() - start, len(_COMPILES) - before))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[9, 10, 11, 12, 13, 14])
    args = parser.parse_args(argv)
    model = build(preset("tiny-gpt2"))
    params = jax.jit(model.init)(jax.random.key(0), model.dummy_batch())
    print(
        f"tiny-gpt2 (max_len {model.config.max_len}), batch 1, 1 new token, "
        f"jax {jax.__version__} on {jax.devices()[0].platform}"
    )
    fresh = session(model, params, args.lengths, bucket=False)  # first: no width 16 cached
    bucketed = session(model, params, args.lengths, bucket=True)
    print(
        f"{'prompt':>6} | {'bucketed s':>10} | {'compiles':>8} | "
        f"{'fresh compile s':>15} | {'compiles':>8}"
    )
    for (n, b, bc), (_, f, fc) in zip(bucketed, fresh, strict=True):
        print(f"{n:>6} | {b:10.3f} | {bc:>8} | {f:15.3f} | {fc:>8}")
    later = lambda rows: max(s for _, s, _ in rows[1:])  # noqa: E731
    print(
        f"after the first call: bucketed at most {later(bucketed):.3f} s, "
        f"{sum(c for *_, c in bucketed[1:])} compiles; fresh compile at most "
        f"{later(fresh):.3f} s, {sum(c for *_, c in fresh[1:])} compiles"
    )


if __name__ == "__main__":
    main()
