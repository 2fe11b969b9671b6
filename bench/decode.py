"""Decoding throughput: KV-cached vs uncached generation, and vs Hugging Face, in one run.

    python bench/decode.py            # GPT-2-small shape, 32-token prompt, 256 new tokens, B=1,8
    python bench/decode.py --quick    # a small smoke run (2-layer model, 16 new tokens)

Random weights, float32, greedy decoding that never stops early (``eos_id=None``; Hugging
Face gets ``min_new_tokens=max_new_tokens``). Tokens/s = batch * new tokens / seconds of a
warm run (median of ``--repeats``); compile time (jax's own trace/lower/compile timers on the
first call) is reported apart.

Uncached = what :func:`tfmjax.decode.generate_uncached` does each step: the full model
(``__call__``, logits for every position) over BOS + prompt + the tokens so far. Running all
256 steps at GPT-2-small size takes minutes, so it is timed at a few sequence lengths and
the total is the sum over the 256 steps of the linearly interpolated per-step time.
Hugging Face (``pip install 'tfmjax[bench]'``: torch + transformers) runs
``GPT2LMHeadModel.generate`` on the same shape with its KV cache; skipped when missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.decode import Greedy, full_logits, generate
from tfmjax.models import build, preset

_spec = importlib.util.spec_from_file_location(
    "bench_torch_twins", Path(__file__).with_name("torch_twins.py")
)
torch_twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_twins)  # the PyTorch models of the same sizes

_COMPILE_SECONDS = []  # trace + lowering + XLA compile time of every jit compile
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: (
        _COMPILE_SECONDS.append(secs) if event.startswith("/jax/core/compile/") else None
    )
)


def _timed(fn, repeats: int):
    """(compile seconds of the first call, median seconds of ``repeats`` warm calls)."""
    before = len(_COMPILE_SECONDS)
    jax.block_until_ready(fn())
    compile_s = sum(_COMPILE_SECONDS[before:])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times)


def bench_cached(model, params, prompts, new_tokens, repeats):
    compile_s, warm = _timed(
        lambda: generate(model, params, prompts, Greedy(), new_tokens, eos_id=None).tokens, repeats
    )
    return warm, compile_s


def bench_uncached(model, params, prompts, new_tokens, points):
    """Per-step full forward timed at ``points`` lengths; returns (total seconds, compile s)."""
    B, P = prompts.shape
    lengths = np.unique(np.linspace(P, P + new_tokens - 1, points).round().astype(int))
    per_step, compile_s = [], 0.0
    for n in lengths:
        tokens = jnp.asarray(np.resize(prompts, (B, n)), jnp.int32)  # any n tokens
        seg = jnp.ones_like(tokens)
        compiled, warm = _timed(lambda t=tokens, s=seg: full_logits(model, params, t, s), 1)
        per_step.append(warm)
        compile_s += compiled
    steps = np.arange(P, P + new_tokens)
    return float(np.interp(steps, lengths, per_step).sum()), compile_s


def bench_hf(cfg, batch, prompt_len, new_tokens, repeats):
    """(seconds, torch threads) for GPT2LMHeadModel.generate (greedy, KV cache); None
    without torch."""
    if not torch_twins.available():
        return None
    import torch

    torch.manual_seed(0)
    model = torch_twins.gpt2(cfg)[0].eval()  # the same sizes and activation as ``cfg``
    ids = torch.randint(5, cfg.vocab_size, (batch, prompt_len))
    mask = torch.ones_like(ids)

    def run(n):
        with torch.inference_mode():
            return model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                num_beams=1,
                pad_token_id=0,
            )

    best_threads = torch_twins.set_fastest_threads(run, warm=4, timed=8)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run(new_tokens)
        times.append(time.perf_counter() - start)
    assert out.shape == (batch, prompt_len + new_tokens), out.shape
    return statistics.median(times), best_threads


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="warm runs per measurement")
    parser.add_argument(
        "--uncached-points",
        type=int,
        default=3,
        help="sequence lengths at which the uncached step is timed",
    )
    args = parser.parse_args(argv)
    if args.quick:
        cfg = preset(
            "gpt2-small",
            vocab_size=512,
            d_model=128,
            num_heads=4,
            d_ff=512,
            num_layers=2,
            max_len=64,
        )
        defaults = dict(batches=[1, 2], prompt_len=8, new_tokens=16, repeats=2)
    else:
        cfg = preset("gpt2-small")
        defaults = dict(batches=[1, 8], prompt_len=32, new_tokens=256, repeats=2)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), model.dummy_batch())
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"model: {'quick' if args.quick else 'gpt2-small'} ({n_params / 1e6:.1f}M params, "
        f"float32), prompt {args.prompt_len}, new tokens {args.new_tokens}, "
        f"jax {jax.__version__} on {jax.devices()[0].platform} x{jax.local_device_count()}"
    )
    rows = []
    hf_missing = False
    for B in args.batches:
        prompts = np.random.default_rng(B).integers(5, cfg.vocab_size, (B, args.prompt_len))
        prompts = prompts.astype(np.int32)
        cached, cached_compile = bench_cached(model, params, prompts, args.new_tokens, args.repeats)
        uncached, uncached_compile = bench_uncached(
            model, params, prompts, args.new_tokens, args.uncached_points
        )
        hf = bench_hf(cfg, B, args.prompt_len, args.new_tokens, args.repeats)
        hf_missing |= hf is None
        hf, hf_threads = (None, None) if hf is None else hf
        rows.append((B, cached, cached_compile, uncached, uncached_compile, hf, hf_threads))

    n = args.new_tokens
    print(
        f"{'batch':>5} | {'cached tok/s':>12} | {'uncached tok/s':>14} | {'HF tok/s':>9} | "
        f"{'cached/uncached':>15} | {'cached/HF':>9} | {'HF threads':>10} | "
        f"{'compile s (cached, uncached)':>28}"
    )
    for B, cached, cc, uncached, uc, hf, hf_threads in rows:
        tps = lambda s, B=B: B * n / s
        hf_tps = f"{tps(hf):9.1f}" if hf else f"{'n/a':>9}"
        hf_ratio = f"{hf / cached:8.2f}x" if hf else f"{'n/a':>9}"
        print(
            f"{B:>5} | {tps(cached):12.1f} | {tps(uncached):14.2f} | {hf_tps} | "
            f"{uncached / cached:14.1f}x | {hf_ratio} | {hf_threads or 'n/a':>10} | "
            f"{cc:13.1f}, {uc:13.1f}"
        )
    print(
        f"uncached: timed at {args.uncached_points} sequence lengths, interpolated over "
        f"{n} steps (extrapolated, not run end to end)"
    )
    if hf_missing:
        print("HF: skipped (torch/transformers not importable; pip install 'tfmjax[bench]')")
    else:
        import torch
        import transformers

        print(
            f"HF: transformers {transformers.__version__} GPT2LMHeadModel.generate, torch "
            f"{torch.__version__}, threads: the faster of 1 and the default on a warm-up, "
            f"greedy with KV cache, min_new_tokens={n}"
        )


if __name__ == "__main__":
    main()
