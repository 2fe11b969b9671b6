"""Paired A/B of train-step variants on the shakespeare_char shape, XLA:CPU, one process.

    python bench/cpu_levers.py [--rounds 10] [--variants nofold,base,flat,unroll,...]

Every variant is compiled once; then ``--rounds`` rounds time ``--steps`` steps of each in
turn (the order turned by one each round), wall and process CPU seconds. The ratio is the
median over the rounds of baseline time / variant time (the first variant is the baseline),
so a busy machine's drifting load cancels; process CPU time is the steadier of the two on
a shared machine. docs/cpu_speed.md records the figures.

Variants, joined with "+" (e.g. ``unroll+flat``):
  base       the step as tfmjax builds it
  nofold     dense layers and tied logits as 3-D dot_generals (before folding to 2-D)
  flat       ``optax.flatten`` around the optimizer (one flat vector for the update; the
             weight-decay mask then sees one 1-D vector, so nothing decays)
  optax      Optax's per-leaf clip + AdamW (``make_optimizer``), what a mesh run uses; the
             base step is a one-device run's, ``tfmjax.train.fused_adamw.FusedAdamW``
  scanloop   the scanned layers as a loop (a stack of up to UNROLL_MAX_LAYERS is unrolled)
  unroll     ``model.scan_layers=false``; ``remat``: ``model.remat=true``
  blockwise, reference   ``model.attention_impl`` (the default picks xla at T=64)
  tanhgelu   the tanh GELU in place of the exact (erf) one: a probe of erf's share only
  headmajor  the xla attention's two einsums as 3-D matmuls over one folded batch axis
             ([B*K, G*T, H] x [B*K, H, S]), the transposes written out
  halves     the batch as two micro-batches whose gradients are independent ops (the
             accumulation's scan unrolled), so XLA may run the two at once on two cores
  noxnn, onednn, noeigenmt, fastmath, vw512, eigendot   XLA:CPU options for this compile
             only (``onednndot``, the dots as oneDNN fusions, fails to compile the step in
             jax 0.10.2: "partition compile failed")
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import tfmjax.kernels.xla as xla_kernel  # noqa: E402
import tfmjax.layers.attention as attention_module  # noqa: E402
import tfmjax.layers.embeddings as embeddings_module  # noqa: E402
import tfmjax.layers.mlp as mlp_module  # noqa: E402
import tfmjax.layers.stack as stack_module  # noqa: E402
from tfmjax.models import build  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402
from tfmjax.train.step import make_train_step  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_train", Path(__file__).with_name("train.py"))
bench_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_train)  # bench/train.py: the shapes and the optimizer

MODEL = {
    "unroll": {"scan_layers": False},
    "remat": {"remat": True},
    "blockwise": {"attention_impl": "blockwise"},
    "reference": {"attention_impl": "reference"},
    "tanhgelu": {"activation": "gelu_tanh"},  # a probe of erf's share: other numerics
}
OPTIONS = {
    "noxnn": {"xla_cpu_use_xnnpack": False},
    "onednn": {"xla_cpu_use_onednn": True},  # alone it leaves the dots to YNNPACK
    "onednndot": {  # the dots as oneDNN fusions (bench/xla_cpu_threads.py)
        "xla_cpu_experimental_ynn_fusion_type": "",
        "xla_cpu_use_onednn": True,
        "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT",
    },
    "eigendot": {  # the dots as XLA's own Eigen dot
        "xla_cpu_experimental_ynn_fusion_type": "",
        "xla_cpu_experimental_xnn_fusion_type": "",
        "xla_cpu_use_xnnpack": False,
    },
    "noeigenmt": {"xla_cpu_multi_thread_eigen": False},
    "fastmath": {"xla_cpu_enable_fast_math": True},
    "vw512": {"xla_cpu_prefer_vector_width": 512},
}


def unfolded_logits(x, table):
    """The tied logits as one 3-D einsum, autodiff for the backward (float32 compute)."""
    return jnp.einsum("BTD,VD->BTV", x, table, preferred_element_type=jnp.float32)


class HeadMajorNumpy:
    """``jax.numpy`` for the xla kernel, but its two attention einsums folded: the heads'
    batch axes (B, K) become one leading axis of a 3-D matmul."""

    def __getattr__(self, name):
        return getattr(jnp, name)

    @staticmethod
    def einsum(spec, a, b, preferred_element_type=None):
        fold = (((2,), (1,)), ((0,), (0,)))  # [X, M, C] x [X, C, N] -> [X, M, N]
        if spec == "BTKGH,BSKH->BKGTS":
            B, T, K, G, H = a.shape
            q = a.transpose(0, 2, 3, 1, 4).reshape(B * K, G * T, H)
            k = b.transpose(0, 2, 3, 1).reshape(B * K, H, b.shape[1])
            out = jax.lax.dot_general(q, k, fold, preferred_element_type=preferred_element_type)
            return out.reshape(B, K, G, T, -1)
        if spec == "BKGTS,BSKH->BTKGH":
            B, K, G, T, S = a.shape
            v = b.transpose(0, 2, 1, 3).reshape(B * K, S, b.shape[-1])
            out = jax.lax.dot_general(
                a.reshape(B * K, G * T, S), v, fold, preferred_element_type=preferred_element_type
            )
            return out.reshape(B, K, G, T, -1).transpose(0, 3, 1, 2, 4)
        return jnp.einsum(spec, a, b, preferred_element_type=preferred_element_type)


OPTIMIZERS = ("base", "flat", "optax")


def compile_variant(name: str, spec: dict, batch: dict):
    """``(compiled step, state)`` of one variant."""
    parts = name.split("+")
    unknown = [
        p
        for p in parts
        if p not in (*MODEL, *OPTIONS, *OPTIMIZERS, "nofold", "scanloop", "headmajor", "halves")
    ]
    if unknown:
        raise SystemExit(f"unknown variant part {unknown[0]!r}; see --help")
    model_kw = {k: v for p in parts for k, v in MODEL.get(p, {}).items()}
    options = {k: v for p in parts for k, v in OPTIONS.get(p, {}).items()}
    cfg = dataclasses.replace(spec["config"], **model_kw)
    tx = bench_train.optimizer(spec["optim"])
    if "optax" in parts:
        tx = bench_train.optimizer(spec["optim"], fused=False)
    if "flat" in parts:
        tx = optax.flatten(tx)
    lr = spec["optim"].learning_rate
    state = create_state(build(cfg), tx, batch, seed=0)
    accum = 2 if "halves" in parts else 1
    step = make_train_step(
        build(cfg, deterministic=False), tx, lambda s: lr, grad_accum_steps=accum
    )
    saved = (mlp_module.folded_dot_general, attention_module.folded_dot_general)
    saved_logits = embeddings_module.tied_logits
    if "nofold" in parts:  # the modules look these names up when the step is traced
        mlp_module.folded_dot_general = attention_module.folded_dot_general = jax.lax.dot_general
        embeddings_module.tied_logits = unfolded_logits
    plain_scan = stack_module.nn.scan
    if "scanloop" in parts:  # the scanned stack as a loop, as before UNROLL_MAX_LAYERS
        stack_module.nn.scan = lambda *args, **kw: plain_scan(*args, **{**kw, "unroll": 1})
    if "headmajor" in parts:
        xla_kernel.jnp = HeadMajorNumpy()
    plain_lax_scan = jax.lax.scan
    if "halves" in parts:  # the two micro-batches' gradients as independent ops
        jax.lax.scan = lambda *args, **kw: plain_lax_scan(*args, **{**kw, "unroll": True})
    try:
        lowered = jax.jit(step, donate_argnums=0).lower(state, batch)
        compiled = lowered.compile(compiler_options=options)
    finally:
        mlp_module.folded_dot_general, attention_module.folded_dot_general = saved
        embeddings_module.tied_logits = saved_logits
        stack_module.nn.scan = plain_scan
        xla_kernel.jnp = jnp
        jax.lax.scan = plain_lax_scan
    return compiled, state


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="steps a variant runs a round")
    parser.add_argument(
        "--variants", default="nofold+scanloop,base,flat,unroll,blockwise,onednn,noxnn"
    )
    args = parser.parse_args(argv)
    spec = bench_train.SHAPES["shakespeare_char"]
    cfg = spec["config"]
    batch = bench_train.random_batch(cfg, spec["batch"], 0, spec["tgt"])
    names = args.variants.split(",")
    steps, states, losses = {}, {}, {}
    for name in names:
        steps[name], states[name] = compile_variant(name, spec, batch)
        for _ in range(3):
            states[name], metrics = steps[name](states[name], batch)
        losses[name] = float(metrics["loss"])
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            state = states[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                state, _ = steps[name](state, batch)
            states[name] = jax.block_until_ready(state)
            wall[name].append((time.perf_counter() - start) / args.steps * 1e3)
            cpu[name].append((time.process_time() - start_cpu) / args.steps * 1e3)
    base = names[0]
    print(
        f"jax {jax.__version__}, shakespeare_char shape, {args.rounds} rounds of {args.steps} "
        f"steps each; ratios: median over rounds of {base} time / variant time"
    )
    header = f"{'variant':<22} {'wall ms':>8} {'vs ' + base:>10} {'cpu ms':>8} {'vs ' + base:>10}"
    print(header + "  loss after 3 steps")
    print("-" * (len(header) + 20))
    for name in names:
        rw = statistics.median(b / v for b, v in zip(wall[base], wall[name], strict=True))
        rc = statistics.median(b / v for b, v in zip(cpu[base], cpu[name], strict=True))
        print(
            f"{name:<22} {statistics.median(wall[name]):>8.1f} {rw:>9.2f}x "
            f"{statistics.median(cpu[name]):>8.1f} {rc:>9.2f}x  {losses[name]:.7f}"
        )
    print("(unroll and remat initialise other parameters: their losses differ by the init)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
