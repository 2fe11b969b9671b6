"""Training throughput: tokens/s and model FLOP/s, as a ratio to a 2048^2 fp32 matmul.

    python bench/train.py [--repeats 3] [--only shakespeare_char|vaswani]

Two shapes, each one jitted ``train_step`` (AdamW, clipping, dropout off, fp32):
  shakespeare_char  the model and batch configs/shakespeare_char.toml trains (read from it):
                    decoder-only, 4 layers, 4 heads, width 128, FFN 512, context 64, batch 12,
                    vocabulary 96, no biases, tied embeddings, learned positions, GELU,
                    pre-LayerNorm; its AdamW settings (lr 1e-3 held constant, betas 0.9/0.99,
                    weight decay 0.1, clipping at 1.0); random token batches, not the text
  vaswani           encoder-decoder 6+6 layers, width 512, 8 heads, FFN 2048, vocabulary 37000,
                    source/target length 32/32, batch 8 (Vaswani et al. 2017 base
                    hyper-parameters)

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

Hugging Face (``pip install 'tfmjax[bench]'``: torch + transformers): with shakespeare_char,
``GPT2LMHeadModel`` training on the same shape is timed in the same run (exact-erf "gelu" as
tfmjax's "gelu", no dropout, tied embeddings, ``torch.optim.AdamW`` with the same settings on
every parameter, gradient clipping at 1.0, loss ``model(ids, labels=ids)`` on random [12, 64]
batches, so the same tokens per step), with torch's thread count the faster of 1 and the
default on a warm-up. GPT-2 has a bias in every linear layer, the tfmjax model none (both
have LayerNorm offsets): both parameter counts are printed. Skipped when torch or
transformers is missing.
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

from tfmjax.config import ModelConfig, OptimConfig  # noqa: E402
from tfmjax.config import load as load_config  # noqa: E402
from tfmjax.models import build, get_preset  # noqa: E402
from tfmjax.train.optimizer import make_optimizer  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402
from tfmjax.train.step import jit_train_step, make_train_step  # noqa: E402

SHAKESPEARE = Path(__file__).resolve().parents[1] / "configs" / "shakespeare_char.toml"
_shakespeare = load_config(SHAKESPEARE)

SHAPES = {
    "shakespeare_char": dict(
        config=_shakespeare.model,
        batch=_shakespeare.data.batch_size,
        src=0,
        tgt=_shakespeare.data.task_params["context"],
        steps=20,
        optim=_shakespeare.optim,  # its AdamW settings, the learning rate held constant
        hf=True,  # also time Hugging Face GPT-2 training on this shape
    ),
    "vaswani": dict(
        config=dataclasses.replace(get_preset("vaswani-base"), dropout_rate=0.0),
        batch=8,
        src=32,
        tgt=32,
        steps=3,
        optim=OptimConfig(learning_rate=1e-4, weight_decay=0.01),
    ),
}
# tfmjax activation -> GPT-2's activation_function: "gelu" is the exact (erf) GELU in both.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


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


def optimizer(o: OptimConfig):
    """The config's clipping + AdamW at a constant learning rate (a schedule costs ~nothing)."""
    return make_optimizer(
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


def bench_hf(spec: dict, repeats: int) -> dict | None:
    """Hugging Face ``GPT2LMHeadModel`` training on ``spec``'s decoder-only shape: per-step
    seconds (median and best of ``repeats`` runs of ``steps`` steps), parameter count, torch
    threads; None without torch/transformers."""
    try:
        import torch
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    cfg, o, B, T = spec["config"], spec["optim"], spec["batch"], spec["tgt"]
    torch.manual_seed(0)
    hf_cfg = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.max_len,
        n_embd=cfg.d_model,
        n_layer=cfg.num_layers,
        n_head=cfg.num_heads,
        n_inner=cfg.d_ff,
        activation_function=HF_ACTIVATIONS[cfg.activation],
        layer_norm_epsilon=cfg.norm_eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=cfg.bos_id,  # GPT-2's own 50256 lies outside this vocabulary
        eos_token_id=2,
    )
    model = GPT2LMHeadModel(hf_cfg).train()
    model.loss_type = "ForCausalLM"  # the loss it falls back to anyway, without a warning
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=o.learning_rate,
        betas=(o.b1, o.b2),
        eps=o.eps,
        weight_decay=o.weight_decay,
    )
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    # A few random batches, made before the clock starts and used in turn (the jax side
    # reuses one random batch: the cost of a step does not depend on the ids).
    batches = [torch.randint(5, cfg.vocab_size, (B, T)) for _ in range(4)]

    def train_steps(n: int) -> None:
        for i in range(n):
            ids = batches[i % len(batches)]
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if o.clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm)
            opt.step()
        assert torch.isfinite(loss), loss

    # torch's OpenMP threads spin-wait: on a busy machine fewer threads can be much faster.
    # Give HF its best thread count, found on a short warm-up (as bench/decode.py does).
    default_threads = torch.get_num_threads()
    trials = {}
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        train_steps(3)
        start = time.perf_counter()
        train_steps(5)
        trials[threads] = time.perf_counter() - start
    best_threads = min(trials, key=trials.get)
    torch.set_num_threads(best_threads)
    train_steps(3)
    per_step = []
    for _ in range(repeats):
        start = time.perf_counter()
        train_steps(spec["steps"])
        per_step.append((time.perf_counter() - start) / spec["steps"])
    return {
        "params": n_params,
        "step_ms": statistics.median(per_step) * 1e3,
        "best_step_ms": min(per_step) * 1e3,
        "threads": best_threads,
        "default_threads": default_threads,
        "attn": model.config._attn_implementation,
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SHAPES), default=None)
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s))")
    chosen = {n: s for n, s in SHAPES.items() if args.only in (None, n)}
    before = matmul_gflops(args.repeats)
    rows = [bench_shape(n, s, args.repeats) for n, s in chosen.items()]
    # Hugging Face right after the jax shapes, inside the two reference matmuls.
    hf = {n: bench_hf(s, args.repeats) for n, s in chosen.items() if s.get("hf")}
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
    for name, h in hf.items():
        if h is None:
            print("HF: skipped (torch/transformers not importable; pip install 'tfmjax[bench]')")
            continue
        r = next(r for r in rows if r["name"] == name)
        spec = SHAPES[name]
        ours, theirs = r["tokens"] / r["step_ms"] * 1e3, r["tokens"] / h["step_ms"] * 1e3
        print(
            f"HF: {h['versions']}; GPT2LMHeadModel training on the {name} shape "
            f"(activation_function={HF_ACTIVATIONS[spec['config'].activation]!r}, attention "
            f"{h['attn']!r}, dropout 0, tied embeddings, torch.optim.AdamW on every parameter, "
            f"clipping {spec['optim'].clip_norm}); torch threads {h['threads']} (the faster of "
            f"1 and the default {h['default_threads']} on a warm-up)"
        )
        print(
            f"HF: params {h['params']:,} (GPT-2: a bias in every linear layer) vs tfmjax "
            f"{r['params']:,} (no linear-layer biases; both have LayerNorm offsets)"
        )
        print(
            f"HF: step {h['step_ms']:.1f} ms (best {h['best_step_ms']:.1f}), "
            f"{theirs:,.0f} tokens/s vs tfmjax {ours:,.0f} tokens/s: "
            f"tfmjax/HF {ours / theirs:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
