"""Schedules against closed forms written independently in NumPy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.train import schedules as S

PEAK, END, WARM, TOTAL = 3e-3, 1e-4, 10, 110
STEPS = [0, 1, 5, 9, 10, 11, 40, 60, 99, 100, 109, 110, 111, 500]


def np_warmup(step, peak, warm):
    return peak if warm == 0 else peak * min(step, warm) / warm


def np_cosine(step, peak, warm, total, end):
    if step < warm:
        return np_warmup(step, peak, warm)
    p = min(step - warm, total - warm) / (total - warm)
    return end + 0.5 * (peak - end) * (1 + math.cos(math.pi * p))


def np_linear(step, peak, warm, total, end):
    if step < warm:
        return np_warmup(step, peak, warm)
    p = min(step - warm, total - warm) / (total - warm)
    return peak + (end - peak) * p


def np_wsd(step, peak, warm, total, frac, end):
    decay_len = round(frac * total)
    start = total - decay_len
    if step < warm:
        return np_warmup(step, peak, warm)
    if step <= start:
        return peak
    if step >= total:
        return end
    return peak + (end - peak) * (step - start) / decay_len


def np_inverse_sqrt(step, d_model, warm, scale):
    if step == 0:
        return 0.0
    return scale * d_model**-0.5 * min(step**-0.5, step * warm**-1.5)


def check(schedule, expected_fn, steps=STEPS):
    got_py = np.array([float(schedule(s)) for s in steps])
    got_arr = np.asarray(jax.jit(schedule)(jnp.asarray(steps, jnp.int32)))
    want = np.array([expected_fn(s) for s in steps])
    assert np.all(np.isfinite(got_py)) and np.all(np.isfinite(got_arr))
    np.testing.assert_allclose(got_py, want, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(got_arr, want, rtol=1e-5, atol=1e-9)
    assert got_arr.dtype == np.float32


def test_warmup_cosine():
    check(S.warmup_cosine(PEAK, WARM, TOTAL, END), lambda s: np_cosine(s, PEAK, WARM, TOTAL, END))


def test_warmup_linear():
    check(S.warmup_linear(PEAK, WARM, TOTAL, END), lambda s: np_linear(s, PEAK, WARM, TOTAL, END))


def test_warmup_constant():
    check(S.warmup_constant(PEAK, WARM), lambda s: np_warmup(s, PEAK, WARM))


def test_warmup_stable_decay():
    f = S.warmup_stable_decay(PEAK, WARM, TOTAL, decay_fraction=0.2, end_lr=END)
    check(f, lambda s: np_wsd(s, PEAK, WARM, TOTAL, 0.2, END))
    assert float(f(88)) == pytest.approx(PEAK)  # decay starts at 110 - 22 = 88


def test_inverse_sqrt():
    d_model, warm, scale = 512, 4000, 2.0
    steps = [0, 1, 10, 1000, 3999, 4000, 4001, 10000, 10**6]
    f = S.inverse_sqrt_warmup(d_model, warm, scale)
    check(f, lambda s: np_inverse_sqrt(s, d_model, warm, scale), steps)


def test_inverse_sqrt_step0_exact_zero_and_finite_grad():
    f = S.inverse_sqrt_warmup(64, 100)
    assert float(f(0)) == 0.0
    assert float(f(jnp.int32(0))) == 0.0
    assert np.isfinite(float(jax.grad(lambda s: f(s))(0.0)))


def test_inverse_sqrt_peak_at_warmup():
    d_model, warm = 256, 50
    f = S.inverse_sqrt_warmup(d_model, warm, scale=3.0)
    lrs = np.asarray(f(jnp.arange(0, 500, dtype=jnp.int32)))
    assert int(np.argmax(lrs)) == warm
    np.testing.assert_allclose(lrs[warm], 3.0 * (d_model * warm) ** -0.5, rtol=1e-6)


@pytest.mark.parametrize("name", ["cosine", "linear", "wsd", "constant"])
def test_zero_warmup_starts_at_peak(name):
    f = S.make_schedule(name, peak_lr=PEAK, warmup_steps=0, total_steps=TOTAL, d_model=8)
    assert float(f(0)) == pytest.approx(PEAK)


@pytest.mark.parametrize("name", ["cosine", "linear", "wsd", "constant", "inverse_sqrt"])
def test_step0_is_zero_with_warmup(name):
    f = S.make_schedule(name, peak_lr=PEAK, warmup_steps=WARM, total_steps=TOTAL, d_model=8)
    assert float(f(0)) == 0.0


def test_warmup_equals_total():
    f = S.warmup_cosine(PEAK, 10, 10, END)
    assert float(f(10)) == pytest.approx(PEAK)
    assert float(f(11)) == pytest.approx(END)


def test_make_schedule_dispatch():
    kw = dict(peak_lr=PEAK, warmup_steps=WARM, total_steps=TOTAL, d_model=64, end_lr=END)
    assert set(S.SCHEDULE_NAMES) == {"inverse_sqrt", "cosine", "linear", "constant", "wsd"}
    steps = jnp.asarray(STEPS, jnp.int32)
    pairs = {
        "cosine": S.warmup_cosine(PEAK, WARM, TOTAL, END),
        "linear": S.warmup_linear(PEAK, WARM, TOTAL, END),
        "constant": S.warmup_constant(PEAK, WARM),
        "wsd": S.warmup_stable_decay(PEAK, WARM, TOTAL, 0.1, END),
        "inverse_sqrt": S.inverse_sqrt_warmup(64, WARM, scale=PEAK),  # peak_lr is the scale
    }
    for name, ref in pairs.items():
        np.testing.assert_array_equal(S.make_schedule(name, **kw)(steps), ref(steps))


def test_errors_are_one_line():
    with pytest.raises(ValueError, match="cosine") as e:
        S.make_schedule("cosin", peak_lr=1.0, warmup_steps=1, total_steps=2, d_model=8)
    assert "\n" not in str(e.value) and "'cosin'" in str(e.value)
    with pytest.raises(ValueError, match=r"warmup_steps must be an int >= 1, got 0"):
        S.inverse_sqrt_warmup(8, 0)
    with pytest.raises(ValueError, match=r"total_steps must be >= warmup_steps=10, got 5"):
        S.warmup_linear(1.0, 10, 5)
    with pytest.raises(ValueError, match=r"peak_lr"):
        S.warmup_constant(-1.0, 0)
    with pytest.raises(ValueError, match=r"decay_fraction"):
        S.warmup_stable_decay(1.0, 50, 100, decay_fraction=0.9)


@pytest.mark.parametrize(
    "build",
    [
        lambda: S.warmup_constant(True, 0),
        lambda: S.warmup_constant(float("nan"), 0),
        lambda: S.warmup_constant(1.0, True),
        lambda: S.warmup_constant(1.0, 2.5),
        lambda: S.warmup_constant(1.0, -1),
        lambda: S.warmup_cosine(1.0, 0, -1),
        lambda: S.inverse_sqrt_warmup(0, 4),
        lambda: S.warmup_stable_decay(1.0, 0, 100, decay_fraction=1.5),
    ],
)
def test_bad_arguments_are_refused(build):
    """bools are not numbers here, NaN is not finite, counts are ints >= their minimum."""
    with pytest.raises(ValueError, match="must be") as e:
        build()
    assert "\n" not in str(e.value)


def test_boundary_arguments_are_accepted():
    """The documented minimums and maximums themselves are valid."""
    assert float(S.inverse_sqrt_warmup(1, 1)(1)) == 1.0  # d_model 1, warmup 1: 1 * min(1, 1)
    assert float(S.warmup_linear(2.0, 0, 0)(0)) == 2.0  # total_steps 0 (nothing to decay)
    full = S.warmup_stable_decay(1.0, 0, 100, decay_fraction=1.0)  # decay over the whole run
    assert float(full(0)) == 1.0 and float(full(50)) == pytest.approx(0.5)
    # The decay may start exactly where warmup ends.
    edge = S.warmup_stable_decay(1.0, 90, 100, decay_fraction=0.1)
    assert float(edge(90)) == 1.0 and float(edge(95)) == pytest.approx(0.5)


def test_wsd_error_names_the_largest_valid_fraction():
    """warmup 50 of 100 steps leaves at most half of them for the decay."""
    with pytest.raises(ValueError, match=r"valid: decay_fraction <= 0\.5$"):
        S.warmup_stable_decay(1.0, 50, 100, decay_fraction=0.8)


def test_defaults():
    """inverse_sqrt's scale is 1; the others end at 0; wsd decays over the last 10%."""
    check(S.inverse_sqrt_warmup(64, 10), lambda s: np_inverse_sqrt(s, 64, 10, 1.0))
    check(S.warmup_cosine(PEAK, WARM, TOTAL), lambda s: np_cosine(s, PEAK, WARM, TOTAL, 0.0))
    check(S.warmup_linear(PEAK, WARM, TOTAL), lambda s: np_linear(s, PEAK, WARM, TOTAL, 0.0))
    check(
        S.warmup_stable_decay(PEAK, WARM, TOTAL),
        lambda s: np_wsd(s, PEAK, WARM, TOTAL, 0.1, 0.0),
    )
    kw = dict(peak_lr=PEAK, warmup_steps=WARM, total_steps=TOTAL, d_model=64)
    check(S.make_schedule("linear", **kw), lambda s: np_linear(s, PEAK, WARM, TOTAL, 0.0))
    check(S.make_schedule("wsd", **kw), lambda s: np_wsd(s, PEAK, WARM, TOTAL, 0.1, 0.0))


@pytest.mark.parametrize("name", S.SCHEDULE_NAMES)
@pytest.mark.parametrize("warm", [0, 1, WARM])
def test_traced_peak_and_warmup_give_the_python_numbers_values(name, warm):
    """The per-run arrays of a stacked program (tfmjax.train.stacked): the same rates as the
    Python numbers up to float32 rounding: ``end - peak`` rounds once more as an array, which
    a decay near its end magnifies (1.2e-6 relative seen), as does inverse_sqrt's
    ``warmup**-1.5``."""
    if name == "inverse_sqrt" and warm == 0:
        return  # needs warmup_steps >= 1
    kw = dict(total_steps=TOTAL, d_model=64, end_lr=END)
    steps = jnp.asarray(STEPS, jnp.int32)
    want = S.make_schedule(name, peak_lr=PEAK, warmup_steps=warm, **kw)(steps)
    traced = jax.jit(
        jax.vmap(lambda p, w: S.make_schedule(name, peak_lr=p, warmup_steps=w, **kw)(steps))
    )
    got = traced(jnp.asarray([PEAK, 2 * PEAK], jnp.float32), jnp.asarray([warm, warm + 3.0]))
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want), rtol=1e-5, atol=0)
    other = S.make_schedule(name, peak_lr=2 * PEAK, warmup_steps=warm + 3, **kw)(steps)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(other), rtol=1e-5, atol=0)
