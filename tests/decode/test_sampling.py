"""Sampling strategies: support (top-k, nucleus), the τ -> 0 limit, and the distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from tfmjax.decode import (
    BeamSearch,
    Greedy,
    Temperature,
    TopK,
    TopP,
    full_logits,
    generate,
    nucleus_mask,
)

B, N = 32, 6
PROMPTS = [[5 + i % 11, 6 + i % 7, 3] for i in range(B)]


def _rollout_logits(model, params, tokens):
    """Reference logits ``[B,N,V]`` of every sampled token, from one uncached forward."""
    prompts = np.asarray(PROMPTS, np.int32)
    seq = np.concatenate([prompts, np.asarray(tokens)], axis=1)
    logits = full_logits(model, params, jnp.asarray(seq), jnp.ones_like(jnp.asarray(seq)))
    return np.asarray(logits)[:, prompts.shape[1] :]


@pytest.fixture(scope="module")
def model_params(tiny):
    return tiny("tiny-llama")


def test_top_k_never_samples_outside_the_top_k(model_params):
    model, params = model_params
    k = 3
    out = generate(model, params, PROMPTS, TopK(k, temperature=3.0), N, rng=0, eos_id=None)
    tokens = np.asarray(out.tokens)
    logits = _rollout_logits(model, params, tokens)
    kth = np.sort(logits, axis=-1)[..., -k]
    chosen = np.take_along_axis(logits, tokens[..., None], -1)[..., 0]
    assert (chosen >= kth - 1e-4).all()
    assert (tokens != logits.argmax(-1)).mean() > 0.2  # it did sample
    # The same temperature without the cut does leave the top k: the check can fail.
    free = np.asarray(
        generate(model, params, PROMPTS, Temperature(3.0), N, rng=0, eos_id=None).tokens
    )
    free_logits = _rollout_logits(model, params, free)
    chosen = np.take_along_axis(free_logits, free[..., None], -1)[..., 0]
    assert (chosen < np.sort(free_logits, axis=-1)[..., -k]).any()


def test_top_p_never_samples_outside_the_nucleus(model_params):
    model, params = model_params
    p, tau = 0.6, 1.5
    tokens = np.asarray(
        generate(model, params, PROMPTS, TopP(p, temperature=tau), N, rng=1, eos_id=None).tokens
    )
    probs = np.asarray(jax.nn.softmax(_rollout_logits(model, params, tokens) / tau, axis=-1))
    chosen = np.take_along_axis(probs, tokens[..., None], -1)
    mass_above = np.where(probs > chosen, probs, 0.0).sum(-1)  # strictly more likely tokens
    assert (mass_above < p + 1e-4).all()
    assert len(np.unique(tokens)) > 3


def test_nucleus_mask_is_the_smallest_set_reaching_p():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.2, 0.1], [0.05, 0.9, 0.03, 0.02]]))
    np.testing.assert_array_equal(
        nucleus_mask(logits, 0.6), [[True, True, False, False], [False, True, False, False]]
    )
    np.testing.assert_array_equal(
        nucleus_mask(logits, 0.7), [[True, True, False, False], [False, True, False, False]]
    )
    np.testing.assert_array_equal(nucleus_mask(logits, 0.71)[0], [True, True, True, False])
    np.testing.assert_array_equal(nucleus_mask(logits, 1.0), np.ones((2, 4), bool))


def test_temperature_towards_zero_is_greedy(model_params):
    model, params = model_params
    greedy = generate(model, params, PROMPTS, Greedy(), N, eos_id=None).tokens
    for seed in (0, 1):
        cold = generate(model, params, PROMPTS, Temperature(1e-4), N, rng=seed, eos_id=None)
        np.testing.assert_array_equal(np.asarray(cold.tokens), np.asarray(greedy))


def test_same_seed_same_tokens(model_params):
    model, params = model_params
    a = generate(model, params, PROMPTS, TopP(0.9), N, rng=jax.random.key(3))
    b = generate(model, params, PROMPTS, TopP(0.9), N, rng=3)
    c = generate(model, params, PROMPTS, TopP(0.9), N, rng=4)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()


def _chi_square_p(samples, expected_probs):
    """p-value of Pearson's test, rare categories (expected < 5) pooled into one bin."""
    n = len(samples)
    counts = np.bincount(samples, minlength=len(expected_probs)).astype(float)
    expected = n * np.asarray(expected_probs, float)
    assert counts[expected == 0].sum() == 0, "sampled a token of probability 0"
    big = expected >= 5
    obs = np.append(counts[big], counts[~big & (expected > 0)].sum())
    exp = np.append(expected[big], expected[~big & (expected > 0)].sum())
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


def test_temperature_sampling_matches_softmax_over_tau(tiny):
    model, params = tiny("tiny-gpt2")
    tau, rows = 1.5, 4000
    prompt = [[7, 8, 9, 3]]
    out = generate(model, params, prompt * rows, Temperature(tau), 1, rng=0, eos_id=None)
    seq = jnp.asarray([prompt[0] + [1]])
    logits = np.asarray(full_logits(model, params, seq, jnp.ones_like(seq)))[0, -1]
    probs = np.asarray(jax.nn.softmax(jnp.asarray(logits) / tau))
    assert probs.max() < 0.6  # a distribution worth testing
    assert _chi_square_p(np.asarray(out.tokens)[:, 0], probs) > 1e-3
    # The test has power: the τ = 1 distribution is rejected.
    assert _chi_square_p(np.asarray(out.tokens)[:, 0], jax.nn.softmax(logits)) < 1e-3


@pytest.mark.parametrize(
    "strategy", [TopK(4, temperature=0.8), TopP(0.7, temperature=1.2)], ids=["top_k", "top_p"]
)
def test_truncated_sampling_matches_renormalised_distribution(strategy):
    """20000 draws follow softmax(logits / tau) cut to the top k or to the nucleus (computed
    here in NumPy: most likely first, each token kept while the mass before it is < p), then
    renormalised."""
    logits = jnp.asarray(np.random.default_rng(0).normal(size=12) * 1.5, jnp.float32)
    samples = jax.jit(strategy.sample)(jnp.broadcast_to(logits, (20000, 12)), jax.random.key(0))
    scaled = np.asarray(logits, np.float64) / strategy.temperature
    if isinstance(strategy, TopK):
        keep = scaled >= np.sort(scaled)[-strategy.k]
    else:
        full = np.exp(scaled - scaled.max())
        full /= full.sum()
        order = np.argsort(-full)
        before = np.cumsum(full[order]) - full[order]  # mass of the more likely tokens
        keep = np.zeros(12, bool)
        keep[order] = before < strategy.p
    probs = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    assert 1 < keep.sum() < 12
    assert _chi_square_p(np.asarray(samples), probs / probs.sum()) > 1e-3


def test_beam_length_penalty_is_gnmt():
    """Wu et al. 2016: ``lp(Y) = ((5 + |Y|) / 6) ** alpha``; alpha 0 turns it off."""

    lengths = np.array([1, 2, 7, 30])
    for alpha in (0.0, 0.6, 1.0):
        got = np.asarray(BeamSearch(beam_size=2, alpha=alpha).length_penalty(lengths))
        np.testing.assert_allclose(got, ((5.0 + lengths) / 6.0) ** alpha, rtol=1e-6)


@pytest.mark.parametrize(
    "build",
    [
        lambda: BeamSearch(beam_size=0),
        lambda: BeamSearch(alpha=-0.1),
        lambda: BeamSearch(alpha=True),
        lambda: BeamSearch(alpha=float("nan")),
        lambda: TopK(k=True),
        lambda: TopK(k=2.0),
        lambda: TopK(k=0),
        lambda: TopP(p=True),
        lambda: TopP(p="0.5"),
        lambda: TopP(p=0.0),
        lambda: TopP(p=1.5),
        lambda: Temperature(temperature=0),
        lambda: Temperature(temperature=True),
        lambda: Temperature(temperature=float("inf")),
    ],
)
def test_strategies_refuse_bad_arguments(build):
    """One-line ValueError for every out-of-range or wrongly typed setting (bools included)."""
    with pytest.raises(ValueError, match="is invalid") as e:
        build()
    assert "\n" not in str(e.value)


def test_strategies_accept_their_boundaries():

    assert TopP(p=1.0).p == 1.0 and TopK(k=1).k == 1
    assert BeamSearch(beam_size=1, alpha=0).beam_size == 1


def test_nucleus_breaks_ties_by_lowest_id():
    """1000 equally likely tokens and p = 0.25: exactly ids 0..249 are kept (an unstable
    sort would keep some other quarter)."""
    keep = np.asarray(nucleus_mask(jnp.zeros((2, 1000)), 0.25))
    np.testing.assert_array_equal(keep, np.arange(1000)[None].repeat(2, 0) < 250)


def test_strategy_defaults():
    """Sampling is at temperature 1 unless asked; beam search keeps 4 with GNMT's alpha 0.6."""
    assert Temperature().temperature == TopK(k=2).temperature == TopP(p=0.5).temperature == 1.0
    assert BeamSearch() == BeamSearch(beam_size=4, alpha=0.6)
    # Frozen and hashable: jax.jit takes strategies as static arguments.
    assert len({Greedy(), Temperature(), BeamSearch(), BeamSearch(beam_size=4, alpha=0.6)}) == 3
