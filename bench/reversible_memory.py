"""Reversible residual layers against the plain stack: the compiled training step's memory.

    python bench/reversible_memory.py                       # L = 2, 4, 8 at T = 256, 1024
    python bench/reversible_memory.py --layers 2 4 --lengths 128

Shapes: a decoder_only model, B=4, D=128, N=4, F=512, vocab 64, float32, softmax attention
(``impl="xla"``: the dense scores, so attention's own memory is counted too), unrolled layers
(``model.scan_layers = false``, which reversible layers need; the plain stack unrolled as well,
so the two differ in the residual only). Each cell compiles ``jit(grad(loss))`` of the
parameters, nothing run, and reads XLA's ``memory_analysis()``: ``temp_size_in_bytes`` (the
buffers live during the step: activations kept for the backward pass, scratch; inputs and
outputs excluded). ``plain/rev``: the plain stack's temp over the reversible one's (> 1:
reversible saves). Compilation only: seconds per cell on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfmjax import config as C  # noqa: E402
from tfmjax.models import build  # noqa: E402

B, D, N, F, V = 4, 128, 4, 512, 64
LAYERS = (2, 4, 8)
LENGTHS = (256, 1024)
MIB = 2**20


def temp_bytes(num_layers: int, length: int, reversible: bool) -> int:
    """XLA's temp buffers of the compiled gradient step of that model."""
    cfg = C.ModelConfig(
        family="decoder_only",
        vocab_size=V,
        d_model=D,
        num_heads=N,
        d_ff=F,
        num_layers=num_layers,
        max_len=length,
        position="learned",
        attention_impl="xla",
        scan_layers=False,
        reversible=reversible,
    )
    model = build(cfg)
    tokens = jnp.full((B, length), 3, jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), {"tokens": tokens})

    def loss(p):
        logp = jax.nn.log_softmax(model.apply(p, {"tokens": tokens}))
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], -1))

    compiled = jax.jit(jax.grad(loss)).lower(params).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def rows(layers, lengths):
    """``(L, T, plain bytes, reversible bytes)`` per cell."""
    return [
        (L, T, temp_bytes(L, T, False), temp_bytes(L, T, True)) for T in lengths for L in layers
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.default_backend()}; B={B} D={D} N={N} F={F}")
    print(f"{'L':>3} {'T':>6} {'plain MiB':>10} {'reversible MiB':>15} {'plain/rev':>10}")
    for L, T, plain, rev in rows(args.layers, args.lengths):
        print(f"{L:>3} {T:>6} {plain / MIB:>10.1f} {rev / MIB:>15.1f} {plain / rev:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
