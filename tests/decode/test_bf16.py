"""bf16 decoding on the CPU at any batch: the attention matmuls upcast there, nowhere else."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.decode import Greedy, generate
from tfmjax.kernels import xla

PROMPTS = [[5, 6, 7, 3], [9, 10, 11, 12, 13, 3]]  # batch 2; widths 5, 7: one bucket (8)


def test_bf16_batch_decodes_each_row_as_alone(tiny):
    model, params = tiny("tiny-gpt2", dtype="bfloat16")
    batch = np.asarray(generate(model, params, PROMPTS, Greedy(), 6, eos_id=None).tokens)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, params, [prompt], Greedy(), 6, eos_id=None).tokens
        np.testing.assert_array_equal(batch[i], np.asarray(alone)[0])
    assert len(np.unique(batch)) > 2, "a degenerate model makes this vacuous"


def _dots(platform: str) -> list[str]:
    """The dot operand types of bf16 attention lowered for ``platform``."""
    q = jnp.zeros((2, 1, 4, 8), jnp.bfloat16)
    k = v = jnp.zeros((2, 5, 2, 8), jnp.bfloat16)
    seg = jnp.ones((2, 1), jnp.int32), jnp.ones((2, 5), jnp.int32)

    def attend(q, k, v):
        return xla.attention(
            q, k, v, causal=True, q_segment_ids=seg[0], kv_segment_ids=seg[1], window=None,
            alibi_slopes=None, bias=None, q_offset=4, scale=0.35,
        )  # fmt: skip

    text = jax.jit(attend).trace(q, k, v).lower(lowering_platforms=(platform,)).as_text()
    return re.findall(r"dot_general.*?: \((tensor<[^)]*)\)", text)


def test_only_the_cpu_lowering_upcasts_the_attention_matmuls():
    cpu, cuda = _dots("cpu"), _dots("cuda")
    assert len(cpu) == len(cuda) == 2
    assert all("bf16" not in d for d in cpu), cpu
    assert all(d.count("bf16") == 2 for d in cuda), cuda
