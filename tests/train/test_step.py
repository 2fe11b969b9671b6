"""The pure train step: masking, accumulation, dropout keys, the non-finite guard, donation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax.checkpoint import params_hash
from tfmjax.config import ModelConfig
from tfmjax.data import make_batch, make_task
from tfmjax.models import build
from tfmjax.train.optimizer import make_optimizer
from tfmjax.train.schedules import make_schedule
from tfmjax.train.state import create_state, reset_window
from tfmjax.train.step import (
    jit_train_step,
    make_eval_step,
    make_train_step,
    step_metrics,
    window_means,
)

TASK = make_task("copy", num_symbols=5, max_len=5)


def tiny(family="encoder_decoder", **kw):
    base = dict(
        family=family,
        vocab_size=16,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=1,
        tie_embeddings=False,
    )
    return ModelConfig(**{**base, **kw})


def setup(cfg, *, lr=1e-2, accum=1, smoothing=0.0, batch_size=8):
    schedule = make_schedule(
        "constant", peak_lr=lr, warmup_steps=0, total_steps=10, d_model=cfg.d_model
    )
    tx = make_optimizer(schedule=schedule, clip_norm=1.0)
    model = build(cfg)
    batch = make_batch(TASK, batch_format=model.batch_format, batch_size=batch_size, seed=0, step=0)
    state = create_state(model, tx, batch, seed=0)
    step = make_train_step(
        build(cfg, deterministic=False),
        tx,
        schedule,
        label_smoothing=smoothing,
        grad_accum_steps=accum,
    )
    return state, jit_train_step(step), batch


@pytest.fixture(scope="module")
def ed():
    """One compiled encoder-decoder step (dropout on) shared by several tests."""
    return setup(tiny(dropout_rate=0.2))


def fresh(state):
    """A copy of ``state`` (the step donates its argument)."""
    return jax.tree.map(jnp.copy, state)


def _scored(batch):
    """Targets and mask read off the batch format: every non-PAD target (encoder-decoder) or
    the ``loss_mask`` positions of ``tokens`` (decoder-only)."""
    if "targets" in batch:
        targets = np.asarray(batch["targets"])
        return targets, (targets != 0).astype(np.float64)
    return np.asarray(batch["tokens"]), np.asarray(batch["loss_mask"], np.float64)


def _nll(logits, targets, mask):
    """Mean negative log-likelihood per scored token, in float64 NumPy."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return -(picked * mask).sum() / mask.sum()


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_loss_falls_on_a_fixed_batch(ed, family):
    """30 steps on one batch halve the loss; the first step's reported loss is the NLL of the
    (dropout-on) model recomputed in NumPy, and the log window holds exactly the sums of the
    30 steps: its mean loss is the mean of the per-step losses to float32 rounding."""
    cfg = tiny(family) if family == "decoder_only" else tiny(dropout_rate=0.2)
    state, step, batch = setup(cfg) if family == "decoder_only" else ed
    state = fresh(state)
    targets, mask = _scored(batch)
    dropout_key = jax.random.fold_in(state.root_key, 0)  # step 0's key: fold_in(root, step)
    logits = jax.jit(build(cfg, deterministic=False).apply)(
        state.params, batch, rngs={"dropout": dropout_key}
    )
    expected_first = _nll(logits, targets, mask)
    losses = []
    for _ in range(30):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(expected_first, rel=1e-5)
    assert losses[-1] < 0.5 * losses[0]
    assert int(state.step) == 30
    window = jax.device_get(state.window)
    assert float(window["steps"]) == 30.0
    assert float(window["tokens"]) == 30 * mask.sum()  # counts: exact
    assert float(window["nll_sum"]) == pytest.approx(mask.sum() * sum(losses), rel=1e-6)
    assert window_means(window)["loss"] == pytest.approx(np.mean(losses), rel=1e-6)


def test_mask_skips_padding_and_prompt():
    ed = make_batch(TASK, batch_format="seq2seq", batch_size=8, seed=0, step=0)
    do = make_batch(TASK, batch_format="prompt_answer", batch_size=8, seed=0, step=0)
    _, ed_mask = build(tiny("encoder_decoder")).targets_and_mask(ed)
    _, do_mask = build(tiny("decoder_only")).targets_and_mask(do)
    # the same examples: the answer (target + EOS) is all that is scored in both families
    assert float(ed_mask.sum()) == float(do_mask.sum()) == float((ed["targets"] != 0).sum())
    for i, p in enumerate(do["prompt_len"]):
        assert float(do_mask[i, :p].sum()) == 0.0
    cfg = tiny("decoder_only")
    state, _, _ = setup(cfg)
    sums = make_eval_step(build(cfg))(state.params, do)
    assert float(sums["tokens"]) == float(do["loss_mask"].sum())


def test_grad_accumulation_matches_one_big_batch():
    cfg = tiny()
    batch = make_batch(TASK, batch_format="seq2seq", batch_size=8, seed=0, step=0)
    tx = optax.sgd(1.0)  # params move by exactly -grad: compares the gradients themselves
    state = create_state(build(cfg), tx, batch, seed=0)
    results = []
    for k in (1, 2):
        step = make_train_step(
            build(cfg, deterministic=False), tx, lambda s: 1.0, grad_accum_steps=k
        )
        results.append(jax.jit(step)(state, batch))
    (s1, m1), (s2, m2) = results
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m1["grad_norm"]), float(m2["grad_norm"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_label_smoothing_reports_plain_nll(ed):
    state, step0, batch = ed
    _, step1, _ = setup(tiny(dropout_rate=0.2), smoothing=0.1)
    _, m0 = step0(fresh(state), batch)
    s1, m1 = step1(fresh(state), batch)
    assert float(m0["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-6)  # same params: same NLL
    means = window_means(jax.device_get(s1.window))
    assert means["smoothed_loss"] > means["loss"]


def test_dropout_key_depends_on_step_only(ed):
    state, step, batch = ed
    a, _ = step(fresh(state), batch)
    b, _ = step(fresh(state), batch)
    c, _ = step(fresh(state).replace(step=jnp.asarray(5, jnp.int32)), batch)
    assert params_hash(a.params) == params_hash(b.params)
    assert params_hash(a.params) != params_hash(c.params)


def test_non_finite_step_keeps_the_old_state(ed):
    state, step, batch = ed
    state, _ = step(fresh(state), batch)
    state = reset_window(state)
    poisoned = jax.tree.map(lambda x: x, state.params)
    leaf = poisoned["params"]["embed"]["token_embed"]["embedding"]
    poisoned["params"]["embed"]["token_embed"]["embedding"] = leaf.at[1].set(jnp.nan)  # BOS
    before = state.replace(params=poisoned)
    opt_hash = params_hash(before.opt_state)
    after, metrics = step(jax.tree.map(jnp.copy, before), batch)
    assert not bool(metrics["finite"])
    assert params_hash(after.opt_state) == opt_hash
    for a, b in zip(jax.tree.leaves(after.params), jax.tree.leaves(before.params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(after.step) == 2
    assert float(after.window["nonfinite"]) == 1.0
    assert int(after.window["first_nonfinite"]) == 1


def test_window_counts_every_non_finite_step_and_keeps_the_first(ed):
    """Two non-finite steps from step 0: the window counts 2 and remembers step 0 (the first
    one, which is also the step number 0 that a sloppy "not yet seen" check would miss)."""
    state, step, batch = ed
    state = reset_window(fresh(state))
    leaf = state.params["params"]["embed"]["token_embed"]["embedding"]
    poisoned = jax.tree.map(lambda x: x, state.params)
    poisoned["params"]["embed"]["token_embed"]["embedding"] = leaf.at[1].set(jnp.nan)  # BOS
    state = state.replace(params=poisoned)
    assert int(state.step) == 0
    for _ in range(2):
        state, metrics = step(state, batch)
        assert not bool(metrics["finite"])
    assert float(state.window["nonfinite"]) == 2.0 and float(state.window["steps"]) == 0.0
    for key in ("loss_sum", "nll_sum", "tokens", "correct", "grad_norm_sum"):
        assert float(state.window[key]) == 0.0, key  # nothing of a bad step is summed
    assert int(state.window["first_nonfinite"]) == 0


def test_state_is_donated(ed):
    state, step, batch = ed
    state = fresh(state)
    leaf = jax.tree.leaves(state.params)[0]
    step(state, batch)
    assert leaf.is_deleted()


def test_bfloat16_compute_keeps_float32_params():
    """dtype=bfloat16 computes in bf16 (the loss differs from float32 compute on the same
    float32 params, within bf16 rounding) and keeps the params and their update in float32."""
    state, step, batch = setup(tiny(dtype="bfloat16"))  # no dropout
    loss32 = _nll(jax.jit(build(tiny()).apply)(state.params, batch), *_scored(batch))
    state, metrics = step(state, batch)
    loss = float(metrics["loss"])
    assert loss != pytest.approx(loss32, rel=1e-5)  # bf16 compute: not the float32 NLL ...
    assert loss == pytest.approx(loss32, rel=2e-2)  # ... but within bf16 rounding of it
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}


@pytest.mark.parametrize(
    "family, one_token",
    [("encoder_decoder", False), ("decoder_only", False), ("decoder_only", True)],
    ids=["encoder_decoder", "decoder_only", "decoder_only_one_scored_token"],
)
def test_sgd_step_follows_the_mean_token_gradient(family, one_token):
    """With plain SGD, one step moves the params by ``-lr * grad(mean NLL per scored token)``
    and reports that gradient's global norm. The loss is written here from the formula
    (log-softmax, picked target, masked mean), not taken from ``tfmjax.losses``."""
    cfg, lr = tiny(family), 0.5
    model = build(cfg)
    batch = make_batch(TASK, batch_format=model.batch_format, batch_size=8, seed=0, step=0)
    if one_token:  # the mean over one token is that token's loss: no division by 2
        only = np.zeros_like(np.asarray(batch["loss_mask"]))
        only[0, np.flatnonzero(np.asarray(batch["loss_mask"])[0])[0]] = 1
        batch = {**batch, "loss_mask": jnp.asarray(only)}
    schedule = optax.constant_schedule(lr)
    state = create_state(model, optax.sgd(lr), batch, seed=0)
    targets, mask = (jnp.asarray(a) for a in _scored(batch))

    def mean_nll(params):
        logp = jax.nn.log_softmax(model.apply(params, batch), axis=-1)
        picked = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), -1)[..., 0]
        return -(picked * mask).sum() / mask.sum()

    grads = jax.jit(jax.grad(mean_nll))(state.params)
    want = jax.tree.map(lambda p, g: p - lr * g, state.params, grads)
    step = jit_train_step(make_train_step(build(cfg, deterministic=False), optax.sgd(lr), schedule))
    new, metrics = step(fresh(state), batch)
    for got, expected in zip(jax.tree.leaves(new.params), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-6)
    assert float(metrics["grad_norm"]) == pytest.approx(float(optax.tree.norm(grads)), rel=1e-5)
    assert float(new.window["nonfinite"]) == 0.0 and int(new.window["first_nonfinite"]) == -1
    logged = window_means(jax.device_get(new.window))  # what the loop logs for this step
    assert logged["grad_norm"] == pytest.approx(float(metrics["grad_norm"]), rel=1e-6)
    assert logged["loss"] == pytest.approx(float(mean_nll(state.params)), rel=1e-5)
    # Accuracy and exact match of the step, from the same logits.
    predicted = np.asarray(jax.jit(model.apply)(state.params, batch)).argmax(-1)
    right = (predicted == np.asarray(targets)) | (np.asarray(mask) == 0)
    scored = np.asarray(mask).sum(-1) > 0
    accuracy = ((predicted == np.asarray(targets)) * np.asarray(mask)).sum() / np.asarray(
        mask
    ).sum()
    exact = (right.all(-1) & scored).sum() / scored.sum()
    assert float(metrics["token_accuracy"]) == pytest.approx(accuracy, rel=1e-6)
    assert float(metrics["exact_match"]) == pytest.approx(exact, rel=1e-6)
    assert logged["exact_match"] == pytest.approx(exact, rel=1e-6)


def test_metrics_are_ratios_of_the_sums():
    """``step_metrics`` and ``window_means`` divide each sum by its own count."""
    sums = dict(loss_sum=6.0, nll_sum=5.0, tokens=4.0, correct=3.0, exact=1.0, sequences=2.0)
    step = step_metrics({k: jnp.float32(v) for k, v in sums.items()}, 0.5, 1e-3, True)
    assert float(step["loss"]) == 1.25 and float(step["token_accuracy"]) == 0.75
    assert float(step["exact_match"]) == 0.5
    window = dict(sums, grad_norm_sum=3.0, steps=2.0, learning_rate=1e-3)
    means = window_means(window)
    assert (means["loss"], means["token_accuracy"], means["exact_match"]) == (1.25, 0.75, 0.5)
    assert means["grad_norm"] == 1.5 and means["smoothed_loss"] == 1.5
    assert means["perplexity"] == pytest.approx(math.exp(1.25))
    # A diverged loss reports perplexity e^80 rather than overflowing to inf.
    diverged = window_means(dict(window, nll_sum=4000.0))
    assert diverged["loss"] == 1000.0 and diverged["perplexity"] == math.exp(80.0)
    # One token, one sequence, one step: each count is 1, not clamped to anything larger.
    one = dict(loss_sum=0.5, nll_sum=0.5, tokens=1.0, correct=1.0, exact=1.0, sequences=1.0)
    step = step_metrics({k: jnp.float32(v) for k, v in one.items()}, 0.5, 1e-3, True)
    assert float(step["token_accuracy"]) == 1.0 and float(step["exact_match"]) == 1.0
    means = window_means(dict(one, grad_norm_sum=0.5, steps=1.0, learning_rate=1e-3))
    assert (means["token_accuracy"], means["exact_match"], means["grad_norm"]) == (1.0, 1.0, 0.5)
