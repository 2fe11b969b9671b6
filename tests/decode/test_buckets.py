"""Compile once: prompt widths in buckets and traced strategy floats give today's tokens."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.decode import BeamSearch, Greedy, Temperature, TopP, generate
from tfmjax.decode.api import _generate_jit
from tfmjax.decode.strategies import bind_traced, split_traced
from tfmjax.kernels.dispatch import BLOCKWISE_MIN_LEN_CPU, choose_impl
from tfmjax.models.prompts import bucket

PROMPTS = [[5, 6, 7, 3], [8, 3], [9, 10, 11, 12, 13, 3]]  # width 7 with BOS: bucket 8
INPUTS = [[5, 6, 7, 2], [8, 2], [9, 10, 11, 12, 13, 2]]  # width 6: bucket 8


def _np(out):
    return jax.tree.map(np.asarray, out)


def test_bucket_is_next_power_of_two_within_the_cap():
    assert [bucket(w, 29) for w in (1, 2, 3, 5, 8, 9, 17, 29)] == [1, 2, 4, 8, 8, 16, 29, 29]
    assert bucket(30, 29) == 30  # never narrower than the prompt
    # nor across a length where "auto" switches kernel (the CPU's blockwise from 512)
    limit = BLOCKWISE_MIN_LEN_CPU
    assert bucket(limit // 2 + 44, 4096) == limit - 1
    assert choose_impl("auto", q_len=limit - 1, kv_len=4096, backend="cpu") == "xla"
    assert bucket(limit + 1, 4096) == 2 * limit


def test_interactive_session_compiles_at_most_two_programs(tiny):
    model, params = tiny("tiny-gpt2", seed=3)
    before = _generate_jit._cache_size()
    outs = []
    for n in (2, 3, 5, 6, 7):  # widths 3..8 with BOS: buckets 4 and 8
        for t in (0.5, 1.0, 1.7):
            prompt = [[5 + (i % 9) for i in range(n - 1)] + [3]]
            outs.append(_np(generate(model, params, prompt, Temperature(t), 3, rng=n)).tokens)
    assert _generate_jit._cache_size() - before <= 2
    assert len({o.tobytes() for o in outs}) > 3, "the session must not repeat one answer"


STRATEGIES = [Greedy(), TopP(0.9, temperature=0.7), BeamSearch(2, alpha=0.6)]


@pytest.mark.parametrize(
    "name,strategy",
    [("tiny-gpt2", s) for s in STRATEGIES] + [("tiny-vaswani", Greedy())],
    ids=["gpt2-greedy", "gpt2-top_p", "gpt2-beam", "vaswani-greedy"],
)
def test_bucketed_equals_exact_width(tiny, name, strategy):
    model, params = tiny(name, **({"position": "alibi"} if name == "tiny-gpt2" else {}))
    prompts = PROMPTS if model.config.family == "decoder_only" else INPUTS
    a = _np(generate(model, params, prompts, strategy, 6, rng=4, eos_id=None))
    b = _np(generate(model, params, prompts, strategy, 6, rng=4, eos_id=None, bucket=False))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    # The wider padding is masked, but the sums over the key axis run over more slots.
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)
    assert len(np.unique(a.tokens)) > 2, "a degenerate model makes this vacuous"


def test_traced_floats_give_the_static_bits():
    logits = 4.0 * jax.random.normal(jax.random.key(0), (8, 50))
    key = jax.random.key(1)
    for strategy in (Temperature(0.7), TopP(0.8, temperature=1.3)):
        static, values = split_traced(strategy)
        other = dataclasses.replace(strategy, temperature=0.5)
        assert static == split_traced(other)[0]  # one jit key for every temperature
        traced = jax.jit(lambda l, k, v, s=static: bind_traced(s, v).sample(l, k))
        constant = jax.jit(strategy.sample)
        for i in range(4):
            k = jax.random.fold_in(key, i)
            np.testing.assert_array_equal(traced(logits, k, values), constant(logits, k))
    lengths = jnp.arange(1, 40)
    for alpha in (0, 0.5, 0.6, 1.0, 2, 1.7):
        static, values = split_traced(BeamSearch(2, alpha))
        traced = jax.jit(lambda n, v, s=static: bind_traced(s, v).length_penalty(n))
        constant = jax.jit(BeamSearch(2, alpha).length_penalty)
        np.testing.assert_array_equal(traced(lengths, values), constant(lengths))
