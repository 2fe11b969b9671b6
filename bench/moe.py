"""Mixture of experts against a dense model at equal steps: training tokens/s and loss, side
by side in one run.

    python bench/moe.py [--steps 200] [--chunk 20] [--config configs/shakespeare_char.toml]

Three models on the same batches (batch ``s`` is the same for all), the config's own model
as the dense baseline (shakespeare_char: 4 layers, width 128, FFN 512):
  dense       the config's model
  switch      every other feed-forward 4 experts of the same width, top-1, capacity 1.25
              (about the dense model's active parameters; more parameters in all)
  mixtral     every feed-forward 4 experts of half the width, top-2, dropless (the dense
              model's active feed-forward width)
The steps run in chunks of ``--chunk``, the models taking turns chunk by chunk, so a busy
machine slows all three alike; tokens/s is the median over chunks (the first, with the
compile, left out). Loss is the train loss (NLL per token) of the last chunk, and for the
mixtures the load-balancing loss and dropped fraction there.

Equal wall time: each model's clock is the sum of its chunks' seconds (the first chunk's
counted at the median rate, without the compile); ``loss @ dense time`` is its chunk loss
interpolated at the moment the dense model finished (the dense one, the fastest, ran every
step by then; a slower model's curve is read part way). No figure is asserted anywhere.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tfmjax.config import load  # noqa: E402
from tfmjax.train.run import build_run  # noqa: E402
from tfmjax.train.state import count_params, create_state, reset_window  # noqa: E402
from tfmjax.train.step import window_means  # noqa: E402


def variants(d_ff: int) -> dict[str, list[str]]:
    """The models compared, as ``model.*`` overrides of the config."""
    return {
        "dense": [],
        "switch": [
            "model.moe_experts=4",
            "model.moe_top_k=1",
            "model.moe_every=2",
            "model.moe_capacity_factor=1.25",
        ],
        "mixtral": [
            "model.moe_experts=4",
            "model.moe_top_k=2",
            "model.moe_capacity_factor=0",
            f"model.d_ff={d_ff // 2}",
        ],
    }


def active_params(params, cfg) -> int:
    """Parameters a token passes through: all, less the experts it is not routed to."""
    total = count_params(params)
    if not cfg.moe_experts:
        return total
    experts = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [getattr(k, "key", "") for k in path]
        if "mlp" in names and "router" not in names and leaf.ndim >= 1:
            scanned = "layers" in names
            if leaf.shape[int(scanned)] == cfg.moe_experts:  # [L?, E, ...]: stacked experts
                experts += leaf.size
    return total - experts + experts * cfg.moe_top_k // cfg.moe_experts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/shakespeare_char.toml")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=20)
    args = parser.parse_args(argv)
    base = load(args.config, [])
    runs, states, rates, means, curves = {}, {}, {}, {}, {}
    for name, overrides in variants(base.model.d_ff).items():
        run = build_run(load(args.config, overrides))  # the config's schedule, cut short
        runs[name] = run
        states[name] = create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings)
        rates[name], curves[name] = [], []  # curves: (steps in chunk, seconds, chunk loss)
    for first in range(0, args.steps, args.chunk):
        end = min(first + args.chunk, args.steps)
        for name, run in runs.items():
            state = reset_window(states[name])
            start = time.perf_counter()
            for step in range(first, end):
                state, _ = run.train_step(state, run.device_batch(step))
            jax.block_until_ready(state.params)
            seconds = time.perf_counter() - start
            if first:  # the first chunk holds the compile
                rates[name].append((end - first) * run.tokens_per_step / seconds)
            states[name] = state
            means[name] = window_means(jax.device_get(state.window))
            curves[name].append((end - first, seconds, means[name]["loss"]))
    print(f"{args.config}, {args.steps} steps, {jax.devices()[0].device_kind}")
    clocks = {
        name: wall_clock(curves[name], runs[name].tokens_per_step, rates[name]) for name in runs
    }
    header = f"{'model':8} {'params':>9} {'active':>9} {'tokens/s':>9} {'loss':>7}"
    print(header + f" {'aux':>6} {'dropped':>7} {'seconds':>8} {'loss @ dense time':>17}")
    for name, run in runs.items():
        params, cfg, m = states[name].params, run.experiment.model, means[name]
        rate = statistics.median(rates[name]) if rates[name] else float("nan")
        row = f"{name:8} {count_params(params):>9,} {active_params(params, cfg):>9,} "
        row += f"{rate:>9.0f} {m['loss']:>7.4f}"
        if cfg.moe_experts:
            row += f" {m['moe_aux_loss']:>6.3f} {m['moe_dropped_fraction']:>7.3f}"
        else:
            row += f" {'':>6} {'':>7}"
        seconds, losses = clocks[name]
        at_dense = np.interp(clocks["dense"][0][-1], seconds, losses)
        print(row + f" {seconds[-1]:>8.1f} {at_dense:>17.4f}")


def wall_clock(curve, tokens_per_step: int, rates) -> tuple[np.ndarray, np.ndarray]:
    """(seconds at the end of each chunk, its chunk loss): the first chunk's seconds are its
    steps at the median rate, since its measured time holds the compile."""
    per_step = tokens_per_step / statistics.median(rates) if rates else curve[0][1] / curve[0][0]
    seconds = [curve[0][0] * per_step] + [s for _, s, _ in curve[1:]]
    return np.cumsum(seconds), np.array([loss for _, _, loss in curve])


if __name__ == "__main__":
    main()
