"""Randomized positions (Ruoss et al. 2023) and Abacus places (McLeish et al. 2024) in the
models: training draws from the step's dropout key only, reaches positions past the row's
length, and evaluation reads one fixed sorted draw (the same for the uncached forward and
decoding); the config and task checks say in one line what is wrong."""

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.config import ConfigError, ModelConfig, load
from tfmjax.layers.positions import alibi_row_bias, alibi_slopes, evaluation_position_table
from tfmjax.models import build, preset
from tfmjax.models.common import PositionExtras, draw_abacus_places

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _loss_grads(params, cfg, batch, deterministic=False):
    """A jitted ``key -> (loss, grads)`` of a training (or evaluation) forward."""
    model = build(cfg, deterministic=deterministic)

    def loss(p, key):
        logits = model.apply(p, batch, rngs={"dropout": key})
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])

    grad = jax.jit(jax.value_and_grad(loss))
    return lambda key: grad(params, key)


def _pos_rows_used(grads, name):
    table = np.asarray(grads["params"]["embed"][name]["pos_embedding"])
    return np.flatnonzero(np.abs(table).sum(1) > 0)


def test_randomized_training_uses_far_positions_from_the_dropout_key_alone(random_params):
    cfg = preset("tiny-gpt2", vocab_size=16, max_len=8, position_sampling="randomized")
    cfg = ModelConfig(**{**cfg.__dict__, "max_position": 64})
    tokens = jnp.asarray(np.random.default_rng(0).integers(5, 16, size=(4, 8)), jnp.int32)
    batch = {"tokens": tokens.at[1, 5:].set(0)}
    model = build(cfg)
    params = random_params(model)
    step = _loss_grads(params, cfg, batch)
    (loss_a, grads), (loss_b, _) = step(jax.random.key(1)), step(jax.random.key(1))
    assert loss_a == loss_b  # the same key: the same positions, bit for bit
    loss_c, _ = step(jax.random.key(2))
    assert loss_c != loss_a  # another step's key draws other positions
    rows = _pos_rows_used(grads, "pos_embed")
    assert rows.max() >= 8 and len(rows) > 8  # positions beyond 0..T-1 were drawn
    # Evaluation (deterministic) reads the fixed table at 0..T-1, whatever the key.
    _, eval_grads = _loss_grads(params, cfg, batch, deterministic=True)(jax.random.key(5))
    table = evaluation_position_table(8, 64)
    np.testing.assert_array_equal(_pos_rows_used(eval_grads, "pos_embed"), table)
    ordered = np.tile(np.arange(8), (4, 1))
    ordered[1, 5:] = np.arange(3)  # the padding is a segment of its own
    ordered = {**batch, "positions": jnp.asarray(ordered)}
    np.testing.assert_array_equal(model.apply(params, batch), model.apply(params, ordered))


@pytest.mark.parametrize("position", ["rope", "sinusoidal"])
def test_randomized_evaluation_is_the_ordered_model_at_the_table_positions(random_params, position):
    """Oracle: a randomized model at evaluation equals the same parameters under ordered
    sampling fed ``positions = table[0..T-1]`` explicitly (Ruoss et al. 2023 sample test
    positions too), for the encodings read per token without parameters sized by the
    positions (learned rows would differ in number). Distance biases: the next test."""
    base = preset("tiny-gpt2", vocab_size=16, max_len=8, position=position)
    randomized = ModelConfig(
        **{**base.__dict__, "position_sampling": "randomized", "max_position": 64}
    )
    ordered = ModelConfig(**{**base.__dict__, "max_len": 64})
    tokens = jnp.asarray(np.random.default_rng(1).integers(5, 16, size=(3, 8)), jnp.int32)
    batch = {"tokens": tokens}
    params = random_params(build(randomized))
    table = jnp.asarray(evaluation_position_table(8, 64))
    explicit = {**batch, "positions": jnp.broadcast_to(table, (3, 8))}
    got = build(randomized).apply(params, batch)
    want = build(ordered).apply(params, explicit)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with_ordered = build(ordered).apply(
        params, {**batch, "positions": jnp.tile(jnp.arange(8), (3, 1))}
    )
    assert not np.allclose(got, with_ordered, atol=1e-4)  # the table is not 0..T-1


def test_randomized_alibi_at_evaluation_is_the_distance_of_table_positions():
    """ALiBi's dense bias at evaluation, cached or not: ``-m_n |table[p] - table[s]|`` (the
    cache's slots share the last query's shift, here none)."""
    cfg = preset("tiny-gpt2", vocab_size=16, max_len=8, position="alibi")
    cfg = ModelConfig(**{**cfg.__dict__, "position_sampling": "randomized", "max_position": 64})
    extras = PositionExtras(cfg, bidirectional=False, deterministic=True)
    table = jnp.asarray(evaluation_position_table(8, 64))
    ordered = jnp.tile(jnp.arange(8), (2, 1))
    want = alibi_row_bias(alibi_slopes(cfg.num_heads), table[ordered], table[ordered])
    _, uncached = extras.apply({}, 8, 8, 0, ordered)
    np.testing.assert_allclose(uncached, want, rtol=1e-6)
    _, cached = extras.apply({}, 3, 8, 5, ordered[:, 5:], cached=True)  # queries 5..7
    np.testing.assert_allclose(cached, want[:, :, 5:], rtol=1e-6)


def test_abacus_training_offsets_the_places_and_evaluation_does_not(random_params):
    cfg = preset("tiny-gpt2", vocab_size=16, max_len=8, position="abacus", digit_first_id=5)
    cfg = ModelConfig(**{**cfg.__dict__, "abacus_max_offset": 50})
    batch = {"tokens": jnp.asarray([[5, 6, 7, 15, 8, 9, 2, 0]] * 8, jnp.int32)}
    params = random_params(build(cfg))
    _, grads = _loss_grads(params, cfg, batch)(jax.random.key(3))
    assert _pos_rows_used(grads, "abacus_embed").max() > 4  # an offset was added
    _, grads = _loss_grads(params, cfg, batch, deterministic=True)(jax.random.key(3))
    # Inputs BOS 5 6 7 + 8 9 EOS: places 0 1 2 3 0 1 2 0.
    np.testing.assert_array_equal(_pos_rows_used(grads, "abacus_embed"), [0, 1, 2, 3])


def test_encoder_decoder_abacus_offsets_both_sides_alike(random_params):
    """One training offset per row for the encoder's operands and the decoder's answer, so
    digits of the same place keep equal places (else cross-attention could not align them):
    the rows used are one run ``o+1 .. o+4``, never two."""
    cfg = preset("tiny-vaswani", vocab_size=16, max_len=8, position="abacus", digit_first_id=5)
    cfg = ModelConfig(**{**cfg.__dict__, "abacus_max_offset": 60})
    batch = {  # operands 3 and 4 digits, answer 4 digits: places 1..4 on both sides
        "inputs": jnp.asarray([[6, 7, 8, 15, 9, 10, 11, 12]], jnp.int32),
        "targets": jnp.asarray([[7, 9, 11, 13, 2, 0, 0, 0]], jnp.int32),
    }
    step = _loss_grads(random_params(build(cfg)), cfg, batch)
    starts = set()
    for seed in range(4):
        rows = _pos_rows_used(step(jax.random.key(seed))[1], "abacus_embed")
        rows = rows[rows > 0]  # row 0: the non-digit tokens
        np.testing.assert_array_equal(rows, np.arange(rows[0], rows[0] + 4))
        starts.add(int(rows[0]))
    assert len(starts) > 1  # the offset does move with the key


def test_encoder_decoder_randomized_abacus_places_are_one_draw_for_both_sides(random_params):
    """Randomized Abacus: places 1..4 of both sides read the same sorted random 4-subset of
    a window of ``abacus_spread * 4 = 8`` place rows, so the rows used are 4, never more,
    spanning at most 8 rows and not always contiguous (places apart meet while training)."""
    cfg = preset("tiny-vaswani", vocab_size=16, max_len=8, position="abacus", digit_first_id=5)
    cfg = ModelConfig(
        **{**cfg.__dict__, "abacus_max_offset": 60, "position_sampling": "randomized"}
    )
    batch = {  # operands 3 and 4 digits, answer 4 digits: places 1..4 on both sides
        "inputs": jnp.asarray([[6, 7, 8, 15, 9, 10, 11, 12]], jnp.int32),
        "targets": jnp.asarray([[7, 9, 11, 13, 2, 0, 0, 0]], jnp.int32),
    }
    step = _loss_grads(random_params(build(cfg)), cfg, batch)
    spans = []
    for seed in range(6):
        rows = _pos_rows_used(step(jax.random.key(seed))[1], "abacus_embed")
        rows = rows[rows > 0]  # row 0: the non-digit tokens
        assert len(rows) == 4 and rows.max() < 8 + 60
        spans.append(int(rows[-1] - rows[0]))
    assert max(spans) <= 7 and max(spans) > 3  # in the window; some draw has gaps


class _PlaceMap(nn.Module):
    cfg: ModelConfig

    def __call__(self, *sides):
        return draw_abacus_places(self, self.cfg, False, *sides)


def _place_maps(sampling, rows=3000, spread=2):
    """Training place maps of ``rows`` copies of one example (longest number: 3 digits)."""
    cfg = preset("tiny-vaswani", vocab_size=16, max_len=8, position="abacus", digit_first_id=5)
    fields = {"abacus_max_offset": 32, "position_sampling": sampling, "abacus_spread": spread}
    cfg = ModelConfig(**{**cfg.__dict__, **fields})
    source = jnp.tile(jnp.asarray([[6, 7, 15, 8, 9, 10, 2]], jnp.int32), (rows, 1))  # K = 3
    answer = jnp.tile(jnp.asarray([[1, 7, 9, 2]], jnp.int32), (rows, 1))  # 2 digits
    maps = _PlaceMap(cfg).apply({}, source, answer, rngs={"dropout": jax.random.key(7)})
    return np.asarray(maps)


def test_ordered_abacus_place_map_is_a_random_offset():
    """Oracle (McLeish et al. 2024): ``map[p] = p + o``, ``o`` uniform in ``[0, 32)``."""
    place_map = _place_maps("ordered")
    assert place_map.shape == (3000, 40) and (place_map[:, 0] == 0).all()
    offsets = place_map[:, 1] - 1
    np.testing.assert_array_equal(place_map[:, 1:], np.arange(1, 40) + offsets[:, None])
    assert set(offsets) == set(range(32))


@pytest.mark.parametrize("spread", [1, 2])
def test_randomized_abacus_place_map_against_its_formula(spread):
    """Oracle: places 1..K (K = 3, the longest number over both sides) are a sorted uniform
    K-subset of a window of ``W = spread K`` of the rows ``1..39``, its start uniform in
    ``[1, 40 - W]``: the first place has mean ``(40 - W - 1) / 2 + 1 + ((W + 1) / (K + 1) -
    1)``, the span ``(W + 1)(K - 1) / (K + 1)`` (order statistics of a uniform subset);
    ``spread = 1`` is a contiguous run at a random offset."""
    K, W, n = 3, 3 * spread, 3000
    place_map = _place_maps("randomized", n, spread)
    assert (place_map[:, 0] == 0).all() and (place_map[:, K + 1 :] == 0).all()
    draws = place_map[:, 1 : K + 1]
    assert (np.diff(draws, axis=1) > 0).all() and draws.min() >= 1 and draws.max() <= 39
    span = draws[:, -1] - draws[:, 0]
    assert span.max() <= W - 1
    if spread == 1:
        np.testing.assert_array_equal(span, K - 1)  # contiguous
    else:
        assert (span > K - 1).mean() > 0.5  # gaps are the rule, ...
        assert (np.diff(draws, axis=1) == 1).any(axis=1).mean() > 0.5  # ... gaps of 1 common
    first_mean = (40 - W - 1) / 2 + 1 + ((W + 1) / (K + 1) - 1)
    span_mean = (W + 1) * (K - 1) / (K + 1)
    tolerance = 4 * 12 / np.sqrt(n)  # 4 standard errors; the first place's sd is below 12
    assert abs(draws[:, 0].mean() - first_mean) < tolerance
    assert abs(span.mean() - span_mean) < tolerance


def test_encoder_places_counted_from_the_end_line_a_reversal_up_with_its_answer():
    """``abacus_count_from = "end"``: the encoder counts each number from its last symbol,
    so in ``reverse`` the answer's p-th symbol and the source symbol it comes from share
    place p (the decoder counts as written); with "start" they do not."""
    from tfmjax.models.common import abacus_places

    source = jnp.asarray([[6, 9, 7, 14, 8, 2]], jnp.int32)  # 5 symbols, EOS
    answer = jnp.asarray([[1, 8, 14, 7, 9, 6]], jnp.int32)  # BOS, the 5 reversed
    for count_from, aligned in (("end", True), ("start", False)):
        cfg = preset("tiny-vaswani", vocab_size=16, max_len=8, position="abacus", digit_first_id=5)
        cfg = ModelConfig(**{**cfg.__dict__, "abacus_count_from": count_from})
        enc = np.asarray(abacus_places(None, source, cfg, True, side="encoder"))[0]
        dec = np.asarray(abacus_places(None, answer, cfg, True, side="decoder"))[0]
        np.testing.assert_array_equal(dec, [0, 1, 2, 3, 4, 5])
        # answer symbol p (decoder slot p) is source symbol 5 - p (encoder slot 5 - p)
        assert all(enc[5 - p] == dec[p] for p in range(1, 6)) is aligned


def test_fire_threshold_sets_the_initial_learned_threshold():
    """``model.fire_threshold`` is L's initial value (softplus of the stored parameter);
    unset, L starts at ``model.max_len``."""
    softplus = lambda x: float(np.log1p(np.exp(x)))  # noqa: E731
    for threshold, want in ((None, 24.0), (2.5, 2.5)):
        cfg = preset(
            "tiny-gpt2", position="fire", max_len=24, num_layers=1, fire_threshold=threshold
        )
        model = build(cfg)
        params = jax.jit(model.init)(jax.random.key(0), model.dummy_batch())
        found = [
            softplus(np.asarray(leaf))
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)
            if jax.tree_util.keystr(path).endswith("['threshold']")
        ]
        assert found and all(t == pytest.approx(want, rel=1e-5) for t in found), found


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"position_sampling": "randomized", "max_position": 16}, "model.max_position"),
        ({"abacus_count_from": "end"}, "model.abacus_count_from"),
        (
            {"position": "abacus", "digit_first_id": 5, "abacus_count_from": "middle"},
            "model.abacus_count_from",
        ),
        (
            {
                "family": "decoder_only",
                "position": "abacus",
                "digit_first_id": 5,
                "abacus_count_from": "end",
            },
            "model.abacus_count_from",
        ),
        ({"max_position": 512}, "model.max_position"),
        ({"position_sampling": "shuffled"}, "model.position_sampling"),
        ({"position": "abacus"}, "model.digit_first_id"),
        ({"digit_first_id": 5}, "model.digit_first_id"),
        ({"position": "fire", "attention_impl": "pallas"}, "model.attention_impl"),
        ({"position": "fire", "attention": "linear"}, "model.position"),
        ({"position": "fire", "fire_threshold": 0.0}, "model.fire_threshold"),
        ({"fire_threshold": 8.0}, "model.fire_threshold"),
        ({"position": "none", "position_sampling": "randomized"}, "model.position_sampling"),
        (
            {
                "position": "abacus",
                "digit_first_id": 5,
                "position_sampling": "randomized",
                "max_position": 64,
            },
            "model.max_position",
        ),
        ({"attention": "retention", "position_sampling": "randomized"}, "model.position_sampling"),
    ],
)
def test_bad_position_options_are_one_line_errors(overrides, field):
    with pytest.raises(ConfigError) as err:
        ModelConfig(max_len=32, **overrides)
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "config,extra,words",
    [
        ("copy_decoder", ["data.task_params.num_symbols=8", "model.digit_first_id=5"], "no digits"),
        ("addition_decoder", ["model.digit_first_id=6"], "model.digit_first_id=5"),
    ],
)
def test_abacus_needs_a_task_with_its_digits(config, extra, words):
    from tfmjax.train.run import _source

    exp = load(CONFIGS / f"{config}.toml", ["model.position=abacus", *extra])
    with pytest.raises(ConfigError, match=words) as err:
        _source(exp, build(exp.model))
    assert "\n" not in str(err.value)
    for ok in ("addition_decoder", "copy_decoder", "reverse"):  # copy, reverse: 10 symbols
        ok = load(CONFIGS / f"{ok}.toml", ["model.position=abacus", "model.digit_first_id=5"])
        assert _source(ok, build(ok.model)).digit_ids == tuple(range(5, 15))
