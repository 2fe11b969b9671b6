"""Decode speed and memory per sequence by attention system, at contexts T = 1k to 16k.

    python bench/mixer_decode.py                 # GPU: width 768, 12 layers, T 1k..16k, bf16
    python bench/mixer_decode.py --quick         # CPU-sized: width 128, 2 layers, T 64..256
    python bench/mixer_decode.py --contexts 1024 4096 --batch 4 --json out.json
    python bench/mixer_decode.py --only MHA --impl xla   # the softmax kernel picked by hand

For each system of ``bench/cache_size.py`` (MHA, GQA, MQA, MLA, linear attention, retention,
the selective scan), a decoder-only model with random weights:

* ``prefill``: one jitted :meth:`prefill` over a ``[B, T]`` prompt (the parallel forms:
  attention kernels, retention's parallel form, the selective scan's associative scan), as
  prompt tokens/s;
* ``decode``: one jitted ``lax.fori_loop`` of ``--steps`` greedy :meth:`decode_step` calls
  from that cache (the recurrent forms: the KV cache read at every step, or the fixed
  state), as ms per step and generated tokens/s (``B / step``);
* ``cache``: the decoding state's bytes per sequence at ``T + steps`` (the cache pytree, as
  in ``bench/cache_size.py``).

Each cell is compiled once (compile time, from jax's own compile timers, reported apart)
and timed as the median of ``--repeats`` warm calls. Ratios are against MHA at the same T,
in the same run. A cell that fails (out of memory, say) is recorded with its one-line reason
and the run goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfmjax.kernels.dispatch import IMPLS  # noqa: E402
from tfmjax.models import build  # noqa: E402


def _bench_module(name: str):
    """A sibling script of bench/ as a module."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).with_name(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cache_size = _bench_module("cache_size")  # the systems and their cache bytes
decode_bench = _bench_module("decode")  # _timed: (compile seconds, median warm seconds)


def measure(cfg, batch: int, context: int, steps: int, repeats: int) -> dict:
    """Prefill and per-step decode times of ``cfg`` for a ``[batch, context]`` prompt."""
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), model.dummy_batch())
    prompts = np.random.default_rng(0).integers(1, cfg.vocab_size, (batch, context))
    arrays = tuple(jnp.asarray(a) for a in model.prompt_arrays(prompts, np.full(batch, context)))

    prefill = jax.jit(functools.partial(model.prefill, max_new_tokens=steps + 1))

    @jax.jit
    def decode(params, logits, cache):
        def step(_, carry):
            logits, cache = carry
            return model.decode_step(params, cache, jnp.argmax(logits, axis=-1))

        return jax.lax.fori_loop(0, steps, step, (logits, cache))[0]

    compile_prefill, prefill_s = decode_bench._timed(lambda: prefill(params, arrays), repeats)
    logits, cache = prefill(params, arrays)
    compile_decode, decode_s = decode_bench._timed(lambda: decode(params, logits, cache), repeats)
    step_s = decode_s / steps
    return dict(
        prefill_ms=1e3 * prefill_s,
        prefill_tokens_per_s=batch * context / prefill_s,
        step_ms=1e3 * step_s,
        decode_tokens_per_s=batch / step_s,
        compile_s=compile_prefill + compile_decode,
        cache_bytes_per_sequence=cache_size.measured_bytes(cfg, context + steps),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CPU-sized model and contexts")
    parser.add_argument("--width", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--contexts", type=int, nargs="+")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="decode steps timed per call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--impl", default="auto", choices=IMPLS, help="model.attention_impl of the systems"
    )
    parser.add_argument(
        "--only", nargs="+", help="systems whose name starts with one of these, in this order"
    )
    parser.add_argument("--json", type=Path, help="write the cells here as well")
    args = parser.parse_args(argv)
    gpu = jax.default_backend() != "cpu"
    width = args.width or (128 if args.quick else 768)
    heads = args.heads or (4 if args.quick else 12)
    layers = args.layers or (2 if args.quick else 12)
    contexts = args.contexts or ([64, 256] if args.quick else [1024, 4096, 16384])
    steps = args.steps or (8 if args.quick else 64)
    dtype = "bfloat16" if gpu else "float32"  # XLA:CPU's bf16 decode fails at batch > 1
    systems = cache_size.systems(width, heads, layers)
    if args.only:
        unknown = [p for p in args.only if not any(k.startswith(p) for k in systems)]
        if unknown:
            parser.error(f"--only {unknown[0]!r} names no system; systems: {', '.join(systems)}")
        systems = {k: v for p in args.only for k, v in systems.items() if k.startswith(p)}
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; decoder-only, width {width}, "
        f"{heads} heads, {layers} layers, batch {args.batch}, {dtype}, {steps} decode steps a "
        f"call, median of {args.repeats}, attention_impl {args.impl}"
    )
    print(
        f"{'system':<22}{'T':>7}{'prefill ms':>12}{'prompt tok/s':>14}{'step ms':>9}"
        f"{'decode tok/s':>14}{'vs MHA':>8}{'cache MB/seq':>14}{'compile s':>11}"
    )
    header = dict(
        jax=jax.__version__,
        device=jax.devices()[0].device_kind,
        width=width,
        heads=heads,
        layers=layers,
        batch=args.batch,
        dtype=dtype,
        attention_impl=args.impl,
        steps=steps,
        repeats=args.repeats,
    )
    cells, mha_step = [], {}

    def save():  # after every cell, so a run cut short keeps what it measured
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(dict(header, cells=cells), indent=1) + "\n")

    for name, cfg in systems.items():
        cfg = dataclasses.replace(
            cfg, dtype=dtype, max_len=max(contexts) + steps + 1, attention_impl=args.impl
        )
        for context in contexts:
            cell = dict(system=name, context=context)
            try:
                cell.update(measure(cfg, args.batch, context, steps, args.repeats))
            except Exception as err:  # noqa: BLE001 (a failed cell is recorded, not fatal)
                cell["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
                print(f"{name:<22}{context:>7}  failed: {cell['error']}", flush=True)
                cells.append(cell)
                save()
                continue
            if name == "MHA":
                mha_step[context] = cell["step_ms"]
            ratio = f"{mha_step[context] / cell['step_ms']:.2f}x" if context in mha_step else "-"
            print(
                f"{name:<22}{context:>7}{cell['prefill_ms']:>12.2f}"
                f"{cell['prefill_tokens_per_s']:>14,.0f}{cell['step_ms']:>9.3f}"
                f"{cell['decode_tokens_per_s']:>14,.0f}{ratio:>8}"
                f"{cell['cache_bytes_per_sequence'] / 2**20:>14.2f}{cell['compile_s']:>11.1f}",
                flush=True,
            )
            cells.append(cell)
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
