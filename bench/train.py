"""Training throughput: tokens/s and model FLOP/s, as a ratio to a 2048^2 fp32 matmul.

    python bench/train.py [--repeats 3] [--only nanogpt|vaswani]

Two shapes, each one jitted ``train_step`` (AdamW, clipping, dropout off, fp32):
  nanogpt-cpu   decoder-only, 4 layers, 4 heads, width 128, FFN 512, context 64, batch 12,
                vocabulary 65 (nanoGPT's shakespeare_char CPU settings)
  vaswani-base  encoder-decoder 6+6 layers, width 512, 8 heads, FFN 2048, vocabulary 37000,
                source/target length 32/32, batch 8 (Vaswani et al. 2017 base hyper-parameters)

Model FLOPs per step (PaLM appendix B convention, no rematerialisation counted):
  6 * sum over matmul weights W of |W| * (tokens that pass through W)
  + 12 * L * (query length) * (key length) * D per sequence and attention block (QK^T and AV,
    forward + backward; causal attention is counted in full, as PaLM does).
Matmul weights are every kernel of ndim >= 2 plus the output projection (tied or not); the
input embedding lookup, norms and biases are not counted. Encoder weights see the source
tokens, decoder weights and the output head see the target tokens.

The reference is ``jnp.dot`` of two 2048x2048 float32 matrices (2 * 2048^3 FLOPs), timed in
the same run, so the ratio cancels most of the machine's speed and load. Compile time
(first call) is reported apart from the timed steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from tfmjax.config import ModelConfig  # noqa: E402
from tfmjax.models import build, get_preset  # noqa: E402
from tfmjax.train.optimizer import make_optimizer  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402
from tfmjax.train.step import jit_train_step, make_train_step  # noqa: E402

SHAPES = {
    "nanogpt": dict(
        config=ModelConfig(
            family="decoder_only",
            vocab_size=65,
            d_model=128,
            num_heads=4,
            d_ff=512,
            num_layers=4,
            max_len=64,
            position="learned",
            activation="gelu",
            tie_embeddings=True,
        ),
        batch=12,
        src=0,
        tgt=64,
        steps=20,
    ),
    "vaswani": dict(
        config=dataclasses.replace(get_preset("vaswani-base"), dropout_rate=0.0),
        batch=8,
        src=32,
        tgt=32,
        steps=3,
    ),
}


def random_batch(cfg: ModelConfig, batch: int, src: int, tgt: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = lambda n: rng.integers(5, cfg.vocab_size, (batch, n), dtype=np.int32)  # noqa: E731
    if cfg.family == "encoder_decoder":
        return {"inputs": ids(src), "targets": ids(tgt)}
    return {
        "tokens": ids(tgt),
        "loss_mask": np.ones((batch, tgt), np.float32),
        "prompt_len": np.zeros((batch,), np.int32),
    }


def matmul_weights(params) -> dict:
    """Sizes of the matmul weights by where they sit: encoder, decoder, output head."""
    sizes = {"encoder": 0, "decoder": 0, "head": 0}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", k)) for k in path]
        if leaf.ndim < 2 or "embed" in names:
            continue
        if "head" in names:
            sizes["head"] += leaf.size
        elif "encoder" in names:
            sizes["encoder"] += leaf.size
        else:
            sizes["decoder"] += leaf.size
    return sizes


def model_flops(cfg: ModelConfig, params, batch: int, src: int, tgt: int) -> float:
    """Training FLOPs of one step (see the module docstring for the convention)."""
    w = matmul_weights(params)
    head = w["head"] or cfg.vocab_size * cfg.d_model  # tied: the embedding is the output projection
    D = cfg.num_heads * cfg.head_width
    flops = 6 * (w["encoder"] * batch * src + (w["decoder"] + head) * batch * tgt)
    if cfg.family == "encoder_decoder":
        attn = cfg.num_layers * src * src + cfg.decoder_layers * (tgt * tgt + tgt * src)
    else:
        attn = cfg.num_layers * tgt * tgt
    return flops + 12 * attn * D * batch


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def matmul_gflops(repeats: int) -> tuple[float, float]:
    """(median, best) GFLOP/s of a jitted 2048x2048 float32 jnp.dot."""
    n = 2048
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    times = timed(lambda: dot(a, b).block_until_ready(), max(5, repeats))
    flops = 2 * n**3
    return flops / statistics.median(times) / 1e9, flops / min(times) / 1e9


def bench_shape(name: str, spec: dict, repeats: int) -> dict:
    cfg, B, S, T = spec["config"], spec["batch"], spec["src"], spec["tgt"]
    batch = random_batch(cfg, B, S, T)
    tx = make_optimizer(schedule=1e-4, weight_decay=0.01)
    state = create_state(build(cfg), tx, batch, seed=0)
    step = jit_train_step(make_train_step(build(cfg, deterministic=False), tx, lambda s: 1e-4))
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    flops = model_flops(cfg, state.params, B, S, T)
    start = time.perf_counter()
    state, _ = step(state, batch)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - start
    holder = [state]

    def run_steps():
        s = holder[0]
        for _ in range(spec["steps"]):
            s, _ = step(s, batch)
        holder[0] = jax.block_until_ready(s)

    per_step = [t / spec["steps"] for t in timed(run_steps, repeats)]
    step_s = statistics.median(per_step)
    return {
        "name": name,
        "params": n_params,
        "tokens": B * (S + T),
        "target_tokens": B * T,
        "compile_s": compile_s,
        "step_ms": step_s * 1e3,
        "best_step_ms": min(per_step) * 1e3,
        "gflop": flops / 1e9,
        "gflops": flops / step_s / 1e9,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SHAPES), default=None)
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s))")
    before = matmul_gflops(args.repeats)
    rows = [bench_shape(n, s, args.repeats) for n, s in SHAPES.items() if args.only in (None, n)]
    after = matmul_gflops(args.repeats)
    ref = statistics.median([before[0], after[0]])
    print(
        f"reference: 2048^2 fp32 jnp.dot {ref:.1f} GFLOP/s (median; before {before[0]:.1f}, "
        f"after {after[0]:.1f}; best {max(before[1], after[1]):.1f})"
    )
    print(
        "FLOPs: 6 * matmul-weights * tokens through them + 12 * L * Tq * Tk * D attention "
        "(PaLM convention; embeddings lookups, norms, biases not counted)"
    )
    header = (
        f"{'shape':<9} {'params':>11} {'tok/step':>8} {'compile s':>9} {'step ms':>9} "
        f"{'best ms':>8} {'tokens/s':>10} {'GFLOP/step':>10} {'GFLOP/s':>8} {'vs dot':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<9} {r['params']:>11,} {r['tokens']:>8} {r['compile_s']:>9.1f} "
            f"{r['step_ms']:>9.1f} {r['best_step_ms']:>8.1f} "
            f"{r['tokens'] / r['step_ms'] * 1e3:>10,.0f} {r['gflop']:>10.2f} "
            f"{r['gflops']:>8.1f} {r['gflops'] / ref:>7.2f}"
        )
    print(
        "tokens/s counts every position the step computes on: B*T (decoder-only), "
        "B*(S+T) (encoder-decoder)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
