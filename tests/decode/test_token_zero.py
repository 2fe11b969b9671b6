"""A model whose vocabulary has no padding id (``model.pad_id = none``) and that continues
exactly the ids it is given (``model.prompt_bos = false``), as imported HF models do: id 0
is a token in prompts, rows are padded by their lengths only, and the cached decode equals
the uncached rollout for every position scheme that measures distance in cache slots."""

import dataclasses

import jax
import numpy as np
import pytest

from tfmjax.decode import Greedy, generate, generate_uncached

PROMPTS = [[0, 6, 0, 3], [8, 0], [0, 10, 11, 0, 13, 0], [0]]  # 0 at start, middle, end
INPUTS = [[0, 6, 7, 0], [8, 0], [0, 10, 0, 12, 13, 2], [0]]
N = 6
CASES = [
    ("tiny-gpt2", {}),
    ("tiny-gpt2", {"position": "alibi"}),
    ("tiny-llama", {"num_kv_heads": 1, "window": 3}),
    ("tiny-vaswani", {"pad_id": 1}),
]


def _np(out):
    return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_token_zero_in_prompts_decodes_as_the_uncached_rollout_and_alone(tiny, name, overrides):
    if name != "tiny-vaswani":
        overrides = dict(overrides, pad_id=None, prompt_bos=False)
    model, params = tiny(name, **overrides)
    prompts = PROMPTS if model.config.family == "decoder_only" else INPUTS
    cached = _np(generate(model, params, prompts, Greedy(), N, eos_id=None))
    uncached = _np(generate_uncached(model, params, prompts, N, eos_id=None))
    np.testing.assert_array_equal(cached.tokens, uncached.tokens)
    np.testing.assert_allclose(cached.log_probs, uncached.log_probs, rtol=1e-4, atol=1e-4)
    for i, prompt in enumerate(prompts):
        alone = _np(generate(model, params, [prompt], Greedy(), N, eos_id=None)).tokens[0]
        np.testing.assert_array_equal(cached.tokens[i], alone)


def test_token_zero_changes_the_answer_and_lengths_cut_an_array(tiny):
    """0 reaches the model (it is not dropped as padding), and an array is cut by its
    ``lengths``, not by any id."""
    model, params = tiny("tiny-gpt2", pad_id=None, prompt_bos=False)
    with_zero = _np(generate(model, params, [[5, 0, 6]], Greedy(), N, eos_id=None)).tokens
    without = _np(generate(model, params, [[5, 6]], Greedy(), N, eos_id=None)).tokens
    assert not np.array_equal(with_zero, without)
    arr = np.array([[5, 0, 6, 9], [5, 6, 9, 9]], np.int32)
    cut = _np(generate(model, params, arr, Greedy(), N, eos_id=None, lengths=[3, 2])).tokens
    np.testing.assert_array_equal(cut, np.concatenate([with_zero, without]))
    with pytest.raises(ValueError, match="each prompt needs at least one id"):
        generate(model, params, [[5], []], Greedy(), N)


def test_a_toy_model_still_puts_bos_first_and_refuses_its_pad_id_inside_a_prompt(tiny):
    model, params = tiny("tiny-gpt2")
    assert model.config.prompt_bos and model.config.pad_id == 0
    bos = model.config.bos_id
    plain = _np(generate(model, params, [[5, 6]], Greedy(), N, eos_id=None)).tokens
    given = _np(
        generate(
            tiny("tiny-gpt2", pad_id=None, prompt_bos=False)[0],
            params,
            [[bos, 5, 6]],
            Greedy(),
            N,
            eos_id=None,
        )
    ).tokens
    np.testing.assert_array_equal(plain, given)
    with pytest.raises(ValueError, match=r"padding \(0\) at 1 before a token"):
        generate(model, params, [[5, 0, 6]], Greedy(), N)


def test_task_evaluation_reads_prompt_lengths_not_padding_ids(tiny):
    """Toy-task batches pad with 0: a decoder-only model without a pad id evaluates them as
    the toy model does (its prompts are cut by their lengths); an encoder-decoder whose pad
    id is not 0 would attend to that padding and is refused in one line."""
    from tfmjax.data import make_task
    from tfmjax.evaluation.evaluator import Evaluator

    task = make_task("reverse")
    model, params = tiny("tiny-gpt2", vocab_size=task.vocab.size)
    config = model.config
    got = []
    for cfg in (config, dataclasses.replace(config, pad_id=None)):
        evaluator = Evaluator(cfg, task, batch_size=8, num_examples=8)
        metrics, _ = evaluator(params)
        predictions = evaluator.predict(params, evaluator.prompts[0])
        got.append(({k: v for k, v in metrics.items() if k != "timing"}, predictions))
    assert got[0][0] == got[1][0]
    np.testing.assert_array_equal(got[0][1], got[1][1])
    seq2seq = dataclasses.replace(tiny("tiny-vaswani")[0].config, pad_id=1)
    with pytest.raises(ValueError, match=r"task batches pad with 0 but model.pad_id=1"):
        Evaluator(seq2seq, task, batch_size=8, num_examples=8)
