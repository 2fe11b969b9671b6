"""generate(): cached greedy == uncached rollout, EOS, padding, beams, input checks, one compile."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.decode import (
    BeamSearch,
    Greedy,
    Temperature,
    TopK,
    TopP,
    full_logits,
    generate,
    generate_uncached,
)
from tfmjax.decode.api import _generate_jit

PROMPTS = [[5, 6, 7, 3], [8, 3], [9, 10, 11, 12, 13, 3], [3]]  # mixed lengths
INPUTS = [[5, 6, 7, 2], [8, 2], [9, 10, 11, 12, 13, 2], [14, 2]]  # encoder inputs
N = 8

FAMILY_CASES = [
    ("tiny-gpt2", {}),
    ("tiny-llama", {"num_kv_heads": 1, "window": 3}),
    ("tiny-vaswani", {}),
    ("tiny-mla", {}),
    ("tiny-linear", {}),
    ("tiny-retnet", {"num_layers": 1}),  # recurrent states: retention's S
    ("tiny-mamba", {"num_layers": 1}),  # the scan state and the convolution's last inputs
    ("tiny-gpt2", {"window": 1, "global_tokens": 2}),  # prompt lengths decoded apart
    ("tiny-gpt2", {"window": 1, "random_blocks": 2, "random_block_size": 2}),  # BigBird: too
]


def _prompts(model):
    return PROMPTS if model.config.family == "decoder_only" else INPUTS


def _np(out):
    return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("name,overrides", FAMILY_CASES, ids=[f"{n}-{o}" for n, o in FAMILY_CASES])
def test_greedy_equals_uncached_argmax_rollout(tiny, name, overrides):
    model, params = tiny(name, **overrides)
    for eos_id in (None, 2):
        cached = _np(generate(model, params, _prompts(model), Greedy(), N, eos_id=eos_id))
        ref = _np(generate_uncached(model, params, _prompts(model), N, eos_id=eos_id))
        np.testing.assert_array_equal(cached.tokens, ref.tokens)
        np.testing.assert_array_equal(cached.lengths, ref.lengths)
        np.testing.assert_allclose(cached.log_probs, ref.log_probs, rtol=1e-5, atol=1e-5)
        if eos_id is None:
            assert len(np.unique(cached.tokens)) > 2, "a degenerate model makes this vacuous"


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-vaswani"])
def test_each_row_stops_at_its_own_eos(tiny, name):
    model, params = tiny(name)
    free = _np(generate(model, params, _prompts(model), Greedy(), N, eos_id=None)).tokens

    # Pick as "EOS" the token whose first occurrence varies most across rows.
    def first(tok):
        return [int(np.argmax(r == tok)) if (r == tok).any() else None for r in free]

    eos = max(range(16), key=lambda tok: len(set(first(tok))))
    assert len(set(first(eos))) >= 2
    out = _np(generate(model, params, _prompts(model), Greedy(), N, eos_id=eos))
    for row, stop, toks, length in zip(free, first(eos), out.tokens, out.lengths, strict=True):
        n = N if stop is None else stop + 1
        np.testing.assert_array_equal(toks[:n], row[:n])
        assert (toks[n:] == 0).all() and length == n
    ref = _np(generate_uncached(model, params, _prompts(model), N, eos_id=eos))
    np.testing.assert_array_equal(out.tokens, ref.tokens)


@pytest.mark.parametrize(
    "name,overrides", [("tiny-gpt2", {"position": "alibi"}), ("tiny-vaswani", {})]
)
def test_padding_never_changes_another_row(tiny, name, overrides):
    model, params = tiny(name, **overrides)
    prompts = _prompts(model)
    batch = _np(generate(model, params, prompts, Greedy(), N)).tokens
    alone = _np(generate(model, params, [prompts[1]], Greedy(), N)).tokens[0]
    np.testing.assert_array_equal(batch[1], alone)
    if model.config.family != "decoder_only":
        return
    # Sampling: same batch size and seed, one row made much longer (wider padding elsewhere).
    longer = list(prompts)
    longer[1] = [5] * 9 + longer[1]
    a = _np(generate(model, params, prompts, TopK(4), N, rng=7)).tokens
    b = _np(generate(model, params, longer, TopK(4), N, rng=7)).tokens
    np.testing.assert_array_equal(np.delete(a, 1, 0), np.delete(b, 1, 0))


def test_right_padded_array_equals_list_of_lists(tiny):
    model, params = tiny("tiny-gpt2")
    arr = np.zeros((len(PROMPTS), 7), np.int32)
    for i, p in enumerate(PROMPTS):
        arr[i, : len(p)] = p
    a = _np(generate(model, params, arr, Greedy(), N)).tokens
    b = _np(generate(model, params, PROMPTS, Greedy(), N)).tokens
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-vaswani"])
def test_beam_size_one_equals_greedy(tiny, name):
    model, params = tiny(name)
    for eos_id in (None, 2):
        greedy = _np(generate(model, params, _prompts(model), Greedy(), N, eos_id=eos_id))
        beam = _np(
            generate(model, params, _prompts(model), BeamSearch(1, alpha=0.0), N, eos_id=eos_id)
        )
        np.testing.assert_array_equal(beam.tokens, greedy.tokens)
        np.testing.assert_array_equal(beam.lengths, greedy.lengths)
        np.testing.assert_allclose(beam.scores, greedy.log_probs, rtol=1e-5, atol=1e-5)


def _brute_force_best(model, params, prompt, steps, eos, alpha):
    """Every hypothesis (ends in EOS, or has ``steps`` tokens) scored log P / lp(len)."""
    V = model.config.vocab_size
    others = [v for v in range(V) if v != eos]
    hyps = [list(p) + [eos] for n in range(steps) for p in itertools.product(others, repeat=n)]
    hyps += [
        list(p)
        for p in itertools.product(range(V), repeat=steps)
        if eos not in p[:-1] and p[-1] != eos
    ]
    lengths = np.array([len(h) for h in hyps])
    family = model.config.family
    P = len(prompt) if family == "decoder_only" else 0
    tokens = np.zeros((len(hyps), P + steps), np.int32)
    for i, h in enumerate(hyps):
        tokens[i, :P], tokens[i, P : P + len(h)] = prompt[:P], h
    seg = (np.arange(P + steps)[None] < (P + lengths)[:, None]).astype(np.int32)
    inputs = None if family == "decoder_only" else jnp.asarray([prompt] * len(hyps), jnp.int32)
    logp = jax.nn.log_softmax(
        full_logits(model, params, jnp.asarray(tokens), jnp.asarray(seg), inputs), axis=-1
    )
    logp = np.take_along_axis(np.asarray(logp), tokens[:, :, None], -1)[:, :, 0]
    total = (logp * seg)[:, P:].sum(1)
    score = total / ((5.0 + lengths) / 6.0) ** alpha
    best = int(np.argmax(score))
    return hyps[best], score[best]


# tiny-retnet, tiny-mamba: beams reorder and repeat recurrent states, not KV slots.
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-vaswani", "tiny-retnet", "tiny-mamba"])
def test_wide_beam_finds_brute_force_best(tiny, name):
    model, params = tiny(name, vocab_size=5, embed_scale=0.5)
    steps, eos, alpha = 3, 2, 0.6
    decoder_only = model.config.family == "decoder_only"
    prompts = [[4, 3, 3], [3, 4, 4]] if decoder_only else [[4, 3, 2], [3, 2]]
    # 16 alive prefixes x 5 tokens = 80 candidates at most: a beam of 80 prunes nothing.
    out = _np(generate(model, params, prompts, BeamSearch(80, alpha=alpha), steps, eos_id=eos))
    for i, prompt in enumerate(prompts):
        best, score = _brute_force_best(model, params, prompt, steps, eos, alpha)
        got = list(out.tokens[i, : out.lengths[i]])
        assert got == best, (got, best)
        np.testing.assert_allclose(out.scores[i], score, rtol=1e-5)


def test_bad_inputs_raise_one_line_value_errors(tiny):
    gpt, gpt_params = tiny("tiny-gpt2")  # learned positions, max_len 32
    ed, ed_params = tiny("tiny-vaswani", position="learned")
    bert, _ = tiny("tiny-bert")
    cases = [
        (gpt, gpt_params, [[5, 16]], Greedy(), 4, {}, "outside the vocabulary"),
        (gpt, gpt_params, [[5, -1]], Greedy(), 4, {}, "outside the vocabulary"),
        (ed, ed_params, [[5, 99, 2]], Greedy(), 4, {}, "outside the vocabulary"),
        (
            gpt,
            gpt_params,
            [[5] * 30],
            Greedy(),
            3,
            {"crop": False},
            "exceeds model.max_len=32: ask for "
            "max_new_tokens <= 2 \\(a language model's text continues past it through "
            "tfmjax.generate_text or python -m tfmjax.generate --input, whose window slides\\)",
        ),
        (
            ed,
            ed_params,
            [[5, 2]],
            Greedy(),
            33,
            {},
            "exceeds model.max_len=32: ask for max_new_tokens <= 32$",
        ),
        (
            ed,
            ed_params,
            [[5] * 33],
            Greedy(),
            3,
            {},
            "encoder input length 33 exceeds model.max_len=32: give an input of at most 32 tokens",
        ),
        (gpt, gpt_params, [[5, 0, 6]], Greedy(), 4, {}, "pad on the right"),
        (gpt, gpt_params, np.ones((2, 3), np.float32), Greedy(), 4, {}, "int array"),
        (gpt, gpt_params, [[5]], Greedy(), 0, {}, "max_new_tokens"),
        (gpt, gpt_params, [[5]], TopK(3), 4, {}, "rng="),
        (gpt, gpt_params, [[5]], TopK(17), 4, {"rng": 0}, "exceeds the vocabulary"),
        (gpt, gpt_params, [[5]], "greedy", 4, {}, "is not one of"),
        (bert, gpt_params, [[5]], Greedy(), 4, {}, "encoder_only"),
    ]
    for model, params, prompts, strategy, n, kw, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            generate(model, params, prompts, strategy, n, **kw)
        assert "\n" not in str(err.value)
    generate(gpt, gpt_params, [[5] * 29], Greedy(), 3)  # 29 + 3 = 32: allowed
    for bad in (
        lambda: Temperature(0.0),
        lambda: TopK(0),
        lambda: TopP(1.5),
        lambda: BeamSearch(0),
        lambda: BeamSearch(2, alpha=-1.0),
    ):
        with pytest.raises(ValueError):
            bad()


def test_compiled_once_per_shape(tiny):
    model, params = tiny("tiny-gpt2", position="rope")
    generate(model, params, [[5, 6, 3], [7, 3]], TopP(0.9), 5, rng=0)
    before = _generate_jit._cache_size()
    for seed, prompts in enumerate([[[8, 9, 3], [3]], [[5, 3], [6, 7, 3]]]):
        generate(model, params, prompts, TopP(0.9), 5, rng=seed + 1)
    generate(model, params, [[5, 6, 3], [7, 3]], TopP(0.8, 0.5), 5, rng=0)  # traced values
    assert _generate_jit._cache_size() == before
    generate(model, params, [[5, 6, 3], [7, 3]], TopK(4), 5, rng=0)  # a new static kind
    assert _generate_jit._cache_size() == before + 1
