"""A model trained on the reverse task decodes identically with and without the KV cache,
and in bf16 (on the CPU too, at batch 128) as in fp32."""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax.data import eval_batches, make_batch, make_task, split_prompt_answer
from tfmjax.data.vocab import EOS_ID
from tfmjax.decode import Greedy, generate, generate_uncached
from tfmjax.losses import cross_entropy
from tfmjax.models import build, preset

STEPS, BATCH = 120, 64


def _train(family: str):
    task = make_task("reverse", max_len=5, num_symbols=6)
    name = "tiny-gpt2" if family == "decoder_only" else "tiny-vaswani"
    cfg = preset(name, vocab_size=task.vocab.size, max_len=16, num_kv_heads=2, norm_position="pre")
    model = build(cfg)
    params = jax.jit(model.init)(jax.random.key(0), model.dummy_batch())
    tx = optax.adam(3e-3)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply(p, batch)
            if family == "decoder_only":
                targets, mask = batch["tokens"], batch["loss_mask"]
            else:
                targets = batch["targets"]
                mask = (targets != 0).astype(jnp.float32)
            total, weight = cross_entropy(logits, targets, mask)
            return total / weight

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for i in range(STEPS):
        batch = make_batch(task, batch_format=model.batch_format, batch_size=BATCH, seed=0, step=i)
        batch = {k: v for k, v in batch.items() if k != "prompt_len"}
        params, opt_state, loss = step(params, opt_state, batch)
    return task, model, params, float(loss)


def _eval_set(task, family):
    batch_format = "prompt_answer" if family == "decoder_only" else "seq2seq"
    batch = eval_batches(task, batch_format=batch_format, batch_size=128, num_examples=128)[0]
    if family == "decoder_only":
        pairs = [
            split_prompt_answer(row, int(n))
            for row, n in zip(batch["tokens"], batch["prompt_len"], strict=True)
        ]
        prompts = [src + [3] for src, _ in pairs]  # source SEP
        answers = [ans for _, ans in pairs]
    else:
        prompts = batch["inputs"]  # source EOS, 0-padded
        answers = [list(t[: list(t).index(EOS_ID)]) for t in batch["targets"]]
    return prompts, answers


def _exact_match(tokens, answers):
    rows = zip(np.asarray(tokens), answers, strict=True)
    hits = [list(row[: len(a) + 1]) == a + [EOS_ID] for row, a in rows]
    return float(np.mean(hits))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder"])
def test_trained_reverse_same_exact_match_cached_and_uncached(family):
    start = time.time()
    task, model, params, loss = _train(family)
    prompts, answers = _eval_set(task, family)
    max_new = task.max_target_len("eval") + 1
    cached = generate(model, params, prompts, Greedy(), max_new)
    uncached = generate_uncached(model, params, prompts, max_new)
    np.testing.assert_array_equal(np.asarray(cached.tokens), np.asarray(uncached.tokens))
    # bf16 compute, batch 128 (on the CPU too): the fp32 answers, bar a near tie. Measured:
    # decoder_only 128/128 rows equal, encoder_decoder 127/128 (two tokens swapped).
    bf16 = build(dataclasses.replace(model.config, dtype="bfloat16"))
    half = np.asarray(generate(bf16, params, prompts, Greedy(), max_new).tokens)
    same = (half == np.asarray(cached.tokens)).all(axis=1)
    assert same.mean() >= (1.0 if family == "decoder_only" else 0.98), np.flatnonzero(~same)
    em = _exact_match(cached.tokens, answers)
    assert em == _exact_match(uncached.tokens, answers)
    assert em > 0.3, f"exact match {em:.2f} (final loss {loss:.3f}): training too short?"
    print(f"{family}: exact match {em:.3f}, loss {loss:.3f}, {time.time() - start:.1f}s")
