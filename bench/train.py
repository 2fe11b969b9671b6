"""Training throughput: tokens/s and model FLOP/s, as a ratio to a 2048^2 fp32 matmul; and
the training loop's step rate with K steps a call and batches built ahead.

    python bench/train.py [--repeats 3] [--only SHAPE ...]

Shapes (``--only``): shakespeare_char, reverse_encdec, reverse_decoder, vaswani, and reverse
(the training loop, below). Each shape is one jitted ``train_step`` (AdamW, clipping,
dropout off, fp32):
  shakespeare_char  the model and batch configs/shakespeare_char.toml trains (read from it):
                    decoder-only, 4 layers, 4 heads, width 128, FFN 512, context 64, batch 12,
                    vocabulary 96, no biases, tied embeddings, learned positions, GELU,
                    pre-LayerNorm; its AdamW settings (lr 1e-3 held constant, betas 0.9/0.99,
                    weight decay 0.1, clipping at 1.0); random token batches, not the text
  vaswani           encoder-decoder 6+6 layers, width 512, 8 heads, FFN 2048, vocabulary 37000,
                    source/target length 32/32, batch 8 (Vaswani et al. 2017 base
                    hyper-parameters)
  reverse_encdec, reverse_decoder   configs/reverse.toml and configs/reverse_decoder.toml

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

reverse: the loop (``tfmjax.train.train``) on configs/reverse.toml, ``train.steps_per_call``
1 and 16 x ``train.prefetch`` off and on, ``--repeats`` rounds of the four runs of
``--loop-steps`` steps (logs every 80; one small eval and one save at the end, untimed);
steps/s is the median of the log windows after the first (the compile), and each variant's
ratio is to 1 / off of the same round (the loop as it was before either existed). Then the
loop's own work (batches, prefetch thread, calls) in one process on one state, the four and
"before" (a jitted step per batch built in the loop, the old loop) in turn, 64 steps each:
paired seconds apart, this is the part to trust on a busy machine.

PyTorch side by side (``pip install 'tfmjax[bench]'``: torch + transformers; skipped when
missing): each shape with a twin is followed by a PyTorch model of the same sizes trained the
same way in the same run (``bench/torch_twins.py``), and the ratio tfmjax/PyTorch is printed
by wall tokens/s and by process CPU time:
  shakespeare_char, reverse_decoder  Hugging Face ``GPT2LMHeadModel`` (a bias in every linear
                                     layer, the tfmjax shakespeare_char model none: both
                                     parameter counts are printed)
  reverse_encdec                     ``torch.nn.Transformer`` (pre-LN, ReLU, sinusoidal)
reverse_encdec and reverse_decoder are the models, batches and AdamW settings of
configs/reverse.toml and configs/reverse_decoder.toml (the learning rate held constant).

Variants of the shakespeare_char step (folded matmuls, the scanned loop, optax.flatten,
attention implementations, XLA:CPU options) are compared paired in bench/cpu_levers.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from tfmjax.config import ModelConfig, OptimConfig  # noqa: E402
from tfmjax.config import load as load_config  # noqa: E402
from tfmjax.models import build, get_preset  # noqa: E402
from tfmjax.train.fused_adamw import FusedAdamW  # noqa: E402
from tfmjax.train.optimizer import make_optimizer  # noqa: E402
from tfmjax.train.run import build_run  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402
from tfmjax.train.step import jit_train_step, make_train_step  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "bench_torch_twins", Path(__file__).with_name("torch_twins.py")
)
torch_twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_twins)  # the PyTorch models of the same sizes

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT / "configs" / "shakespeare_char.toml"
REVERSE = ROOT / "configs" / "reverse.toml"
REVERSE_DECODER = ROOT / "configs" / "reverse_decoder.toml"
LOOP_VARIANTS = [(1, False), (1, True), (16, False), (16, True)]  # (steps_per_call, prefetch)
LOOP_LOG_EVERY = 80
_shakespeare = load_config(SHAKESPEARE)


def _config_shape(path: Path, twin: str, steps: int) -> dict:
    """The model, batch size and sequence lengths ``path`` trains, and its AdamW settings."""
    experiment = load_config(path)
    batch = build_run(experiment).batch(0)
    if experiment.model.family == "encoder_decoder":
        src, tgt = batch["inputs"].shape[1], batch["targets"].shape[1]
    else:
        src, tgt = 0, batch["tokens"].shape[1]
    return dict(
        config=experiment.model,
        batch=experiment.data.batch_size,
        src=src,
        tgt=tgt,
        steps=steps,
        optim=experiment.optim,  # its AdamW settings, the learning rate held constant
        twin=twin,  # the PyTorch model of the same sizes timed beside it
    )


SHAPES = {
    "shakespeare_char": dict(
        config=_shakespeare.model,
        batch=_shakespeare.data.batch_size,
        src=0,
        tgt=_shakespeare.data.task_params["context"],
        steps=20,
        optim=_shakespeare.optim,  # its AdamW settings, the learning rate held constant
        twin="gpt2",  # also time Hugging Face GPT-2 training on this shape
    ),
    "reverse_encdec": _config_shape(REVERSE, "transformer", steps=20),
    "reverse_decoder": _config_shape(REVERSE_DECODER, "gpt2", steps=20),
    "vaswani": dict(
        config=dataclasses.replace(get_preset("vaswani-base"), dropout_rate=0.0),
        batch=8,
        src=32,
        tgt=32,
        steps=3,
        optim=OptimConfig(learning_rate=1e-4, weight_decay=0.01),
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


def optimizer(o: OptimConfig, fused: bool = True):
    """The config's clipping + AdamW at a constant learning rate (a schedule costs ~nothing):
    as a one-device run has it (``FusedAdamW``), or (``fused=False``) Optax's per leaf, as a
    run on a mesh has it."""
    return (FusedAdamW if fused else make_optimizer)(
        schedule=o.learning_rate,
        weight_decay=o.weight_decay,
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        clip_norm=o.clip_norm,
    )


def bench_shape(name: str, spec: dict, repeats: int) -> dict:
    cfg, B, S, T = spec["config"], spec["batch"], spec["src"], spec["tgt"]
    batch = random_batch(cfg, B, S, T)
    tx = optimizer(spec["optim"])
    state = create_state(build(cfg), tx, batch, seed=0)
    lr = spec["optim"].learning_rate
    step = jit_train_step(make_train_step(build(cfg, deterministic=False), tx, lambda s: lr))
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

    per_step, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        run_steps()
        per_step.append((time.perf_counter() - start) / spec["steps"])
        cpu.append((time.process_time() - start_cpu) / spec["steps"])
    step_s = statistics.median(per_step)
    return {
        "name": name,
        "params": n_params,
        "tokens": B * (S + T),
        "target_tokens": B * T,
        "compile_s": compile_s,
        "step_ms": step_s * 1e3,
        "best_step_ms": min(per_step) * 1e3,
        "cpu_ms": statistics.median(cpu) * 1e3,
        "gflop": flops / 1e9,
        "gflops": flops / step_s / 1e9,
    }


def loop_rate(k: int, prefetch: bool, steps: int, workdir: Path) -> dict:
    """One training run of configs/reverse.toml: steps/s and tokens/s of the timed windows."""
    from tfmjax.reporting.metrics_log import read_records
    from tfmjax.train import train

    overrides = [
        f"train.steps={steps}",
        f"train.log_every={LOOP_LOG_EVERY}",
        f"train.eval_every={steps}",
        f"train.checkpoint_every={steps}",
        f"train.steps_per_call={k}",
        f"train.prefetch={str(prefetch).lower()}",
        f"train.workdir={workdir}",
        "data.eval_examples=64",
    ]
    with open(os.devnull, "w") as quiet:
        train(load_config(REVERSE, overrides), progress=False, plot=False, stream=quiet)
    windows = [r["timing"] for r in read_records(workdir / "metrics.jsonl")[1:]]
    windows = [w for w in windows if "steps_per_sec" in w]
    return {
        "steps_per_sec": statistics.median(w["steps_per_sec"] for w in windows),
        "tokens_per_sec": statistics.median(w["tokens_per_sec"] for w in windows),
    }


def bench_loop(repeats: int, steps: int) -> dict:
    """Each (steps_per_call, prefetch) run ``repeats`` times, in rounds of all four (the order
    turned by one each round): median and best steps/s, median tokens/s, and the median over
    the rounds of each one's ratio to the round's steps_per_call 1 without prefetch (pairing
    runs a minute apart cancels most of a shared machine's drifting load). The four share one
    build (the loop's settings do not change what is compiled): each program compiles once."""
    import tempfile

    runs = {variant: [] for variant in LOOP_VARIANTS}
    ratios = {variant: [] for variant in LOOP_VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            turn = r % len(LOOP_VARIANTS)
            got = {}
            for k, prefetch in LOOP_VARIANTS[turn:] + LOOP_VARIANTS[:turn]:
                workdir = Path(tmp) / f"k{k}-{prefetch}-{r}"
                got[(k, prefetch)] = loop_rate(k, prefetch, steps, workdir)
            base = got[LOOP_VARIANTS[0]]["steps_per_sec"]
            for variant, rate in got.items():
                runs[variant].append(rate)
                ratios[variant].append(rate["steps_per_sec"] / base)
    return {
        variant: {
            "steps_per_sec": statistics.median(run["steps_per_sec"] for run in got),
            "best": max(run["steps_per_sec"] for run in got),
            "tokens_per_sec": statistics.median(run["tokens_per_sec"] for run in got),
            "ratio": statistics.median(ratios[variant]),
            "ratios": ratios[variant],
        }
        for variant, got in runs.items()
    }


def bench_loop_paired(rounds: int, segment: int = 64) -> dict:
    """The loop's own work, one process, one state: ``segment`` steps of each variant in turn
    (batches, prefetch thread, calls; the order turned each round), and "before": a jitted
    step per batch built in the loop, as the loop ran before steps_per_call and prefetch.
    Median steps/s and the median of each round's ratio to "before"."""
    from tfmjax.train.loop import call_spans
    from tfmjax.train.prefetch import Prefetcher

    run = build_run(load_config(REVERSE, [f"train.log_every={LOOP_LOG_EVERY}"]))
    holder = [create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings), 0]

    def rate(variant) -> float:
        state, first = holder
        begin = time.perf_counter()
        if variant == "before":
            for s in range(first, first + segment):
                state, _ = run.train_step(state, run.device_batch(s))
        else:
            spans = call_spans(first, first + segment, variant[0])
            build = lambda span: run.device_batches(*span)  # noqa: E731
            with Prefetcher(build, spans, background=variant[1]) as batches:
                for span in spans:
                    state, _ = run.train_steps(state, batches.take(span))
        holder[:] = [jax.block_until_ready(state), first + segment]
        return segment / (time.perf_counter() - begin)

    variants = ["before", *LOOP_VARIANTS]
    for variant in variants:  # compile
        rate(variant)
    rates = {v: [] for v in variants}
    for r in range(rounds):
        got = {v: rate(v) for v in variants[r % 5 :] + variants[: r % 5]}
        for v in variants:
            rates[v].append((got[v], got[v] / got["before"]))
    return {
        v: (statistics.median(a for a, _ in got), statistics.median(b for _, b in got))
        for v, got in rates.items()
    }


def print_loop(rows: dict, repeats: int, steps: int) -> None:
    print(
        f"\nreverse: the training loop on {REVERSE.relative_to(ROOT)} ({steps} steps a run, "
        f"steps/s of the log windows after the first; {repeats} rounds of the four runs)"
    )
    header = (
        f"{'steps_per_call':>14} {'prefetch':>8} {'steps/s':>8} {'best':>6} {'tokens/s':>9} "
        f"{'vs 1, off':>9}  each round"
    )
    print(header)
    print("-" * len(header))
    for (k, prefetch), row in rows.items():
        each = " ".join(f"{v:.2f}" for v in row["ratios"])
        print(
            f"{k:>14} {'on' if prefetch else 'off':>8} {row['steps_per_sec']:>8.1f} "
            f"{row['best']:>6.1f} {row['tokens_per_sec']:>9,.0f} {row['ratio']:>8.2f}x  {each}"
        )
    print(
        "steps/s, tokens/s: medians over the rounds; vs 1, off: the median of each round's "
        "ratio; steps_per_call 1 with prefetch off is the loop as it was before either existed."
    )


def print_loop_paired(rows: dict, rounds: int) -> None:
    print(
        f"\nreverse, the loop's own work: one process, one state, {rounds} rounds of 64 steps "
        "of each in turn (steps/s median; vs before: the median of the rounds' ratios)"
    )
    for v, (steps_per_sec, ratio) in rows.items():
        name = v if v == "before" else f"{v[0]:>2} a call, prefetch {'on' if v[1] else 'off'}"
        print(f"  {name:<24} {steps_per_sec:>6.1f} steps/s {ratio:>6.2f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only", nargs="+", choices=[*SHAPES, "reverse"], help="shapes to run (default: all)"
    )
    parser.add_argument(
        "--loop-steps", type=int, default=400, help="steps of each reverse run (a multiple of 80)"
    )
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s))")
    only = set(args.only or [*SHAPES, "reverse"])
    if "reverse" in only:
        rows = bench_loop(args.repeats, args.loop_steps)
        print_loop(rows, args.repeats, args.loop_steps)
        rounds = max(6, 2 * args.repeats)
        print_loop_paired(bench_loop_paired(rounds), rounds)
    chosen = {n: s for n, s in SHAPES.items() if n in only}
    if not chosen:
        return 0
    before = matmul_gflops(args.repeats)
    rows = [bench_shape(n, s, args.repeats) for n, s in chosen.items()]
    # The PyTorch twins right after the jax shapes, inside the two reference matmuls.
    twins = {}
    if torch_twins.available():
        for name, spec in chosen.items():
            if "twin" in spec:
                batch = random_batch(spec["config"], spec["batch"], spec["src"], spec["tgt"])
                args_ = (spec["twin"], spec["config"], spec["optim"], batch, spec["steps"])
                twins[name] = torch_twins.time_training(*args_, args.repeats)
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
        f"{'shape':<16} {'params':>11} {'tok/step':>8} {'compile s':>9} {'step ms':>9} "
        f"{'best ms':>8} {'tokens/s':>10} {'GFLOP/step':>10} {'GFLOP/s':>8} {'vs dot':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<16} {r['params']:>11,} {r['tokens']:>8} {r['compile_s']:>9.1f} "
            f"{r['step_ms']:>9.1f} {r['best_step_ms']:>8.1f} "
            f"{r['tokens'] / r['step_ms'] * 1e3:>10,.0f} {r['gflop']:>10.2f} "
            f"{r['gflops']:>8.1f} {r['gflops'] / ref:>7.2f}"
        )
    print(
        "tokens/s counts every position the step computes on: B*T (decoder-only), "
        "B*(S+T) (encoder-decoder)."
    )
    if not torch_twins.available():
        print("PyTorch: skipped (torch/transformers not importable; pip install 'tfmjax[bench]')")
    for name, h in twins.items():
        r = next(r for r in rows if r["name"] == name)
        spec = SHAPES[name]
        ours, theirs = r["tokens"] / r["step_ms"] * 1e3, r["tokens"] / h["step_ms"] * 1e3
        print(
            f"{name} vs {torch_twins.TWIN_NAMES[spec['twin']]} ({h['versions']}, torch threads "
            f"{h['threads']}: the faster of 1 and {h['default_threads']} on a warm-up): params "
            f"{h['params']:,} vs tfmjax {r['params']:,}; step {h['step_ms']:.1f} ms (best "
            f"{h['best_step_ms']:.1f}), {theirs:,.0f} tokens/s vs tfmjax {ours:,.0f}: "
            f"tfmjax/PyTorch {ours / theirs:.2f}x by wall, {h['cpu_ms'] / r['cpu_ms']:.2f}x by "
            f"process CPU time ({r['cpu_ms']:.1f} vs {h['cpu_ms']:.1f} ms a step)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
