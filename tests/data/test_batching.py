"""Batching: pure function of (seed, step), fixed shapes, padding, loss masks."""

import numpy as np
import pytest

from tfmjax.data import (
    EOS_ID,
    PAD_ID,
    SEP_ID,
    TASK_NAMES,
    batch_widths,
    eval_batches,
    example_split,
    iterate_batches,
    make_batch,
    make_task,
    split_prompt_answer,
)

FORMATS = ["seq2seq", "prompt_answer"]
B = 16


def _batch(task, fmt, seed=0, step=0, split="train", batch_size=B):
    return make_batch(
        task, batch_format=fmt, batch_size=batch_size, seed=seed, step=step, split=split
    )


def _equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _row_ends(row):
    """Index of the single EOS in a row; everything after it must be PAD."""
    eos = np.flatnonzero(row == EOS_ID)
    assert len(eos) == 1, row
    assert np.all(row[eos[0] + 1 :] == PAD_ID), row
    assert np.all(row[: eos[0]] != PAD_ID), row
    return int(eos[0])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", TASK_NAMES)
def test_deterministic_and_fixed_shapes(name, fmt):
    task = make_task(name)
    first = _batch(task, fmt, seed=3, step=5)
    assert _equal(first, _batch(task, fmt, seed=3, step=5))
    np.random.seed(123)  # global numpy state must not matter
    assert _equal(first, _batch(task, fmt, seed=3, step=5))
    assert not _equal(first, _batch(task, fmt, seed=3, step=6))
    assert not _equal(first, _batch(task, fmt, seed=4, step=5))
    widths = batch_widths(task, batch_format=fmt)
    for step in range(4):
        for split in ("train", "eval"):  # same shapes, so train/eval share one compilation
            batch = _batch(task, fmt, seed=3, step=step, split=split)
            for key, width in widths.items():
                assert batch[key].shape == (B, width) and batch[key].dtype == np.int32
            if fmt == "prompt_answer":
                assert batch["loss_mask"].shape == (B, widths["tokens"])
                assert batch["loss_mask"].dtype == np.float32
                assert batch["prompt_len"].shape == (B,) and batch["prompt_len"].dtype == np.int32


@pytest.mark.parametrize("name", TASK_NAMES)
def test_encoder_decoder_layout(name):
    task = make_task(name)
    batch = _batch(task, "seq2seq", step=1)
    assert set(batch) == {"inputs", "targets"}
    assert batch["inputs"].shape[1] == task.max_source_len("train") + 1
    assert batch["targets"].shape[1] == task.max_target_len("train") + 1
    for src_row, tgt_row in zip(batch["inputs"], batch["targets"], strict=True):
        s, t = _row_ends(src_row), _row_ends(tgt_row)
        assert s >= 1 and t >= 1
        assert np.all(src_row[:s] >= 5) and np.all(tgt_row[:t] >= 5)


@pytest.mark.parametrize("split", ["train", "length"])
@pytest.mark.parametrize("name", TASK_NAMES)
def test_decoder_only_layout_and_loss_mask(name, split):
    task = make_task(name)
    dec = _batch(task, "prompt_answer", step=2, split=split)
    enc = _batch(task, "seq2seq", step=2, split=split)  # same rng draws -> same examples
    assert set(dec) == {"tokens", "loss_mask", "prompt_len"}
    for i in range(B):
        row, mask, p = dec["tokens"][i], dec["loss_mask"][i], int(dec["prompt_len"][i])
        end = _row_ends(row)
        source = enc["inputs"][i][: _row_ends(enc["inputs"][i])].tolist()
        target = enc["targets"][i][: _row_ends(enc["targets"][i])].tolist()
        assert p == len(source) + 1
        assert row.tolist()[: end + 1] == source + [SEP_ID] + target + [EOS_ID]
        expected_mask = np.zeros_like(mask)
        expected_mask[p : end + 1] = 1.0  # target tokens and the EOS, nothing else
        assert np.array_equal(mask, expected_mask)
        assert mask.sum() == len(target) + 1
        assert split_prompt_answer(row, p) == (source, target)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_length_split_is_wider(name):
    task = make_task(name)
    for fmt in FORMATS:
        train = batch_widths(task, batch_format=fmt)
        length = batch_widths(task, batch_format=fmt, split="length")
        assert all(length[k] >= train[k] for k in train) and length != train
        batch = _batch(task, fmt, split="length")
        assert all(batch[k].shape == (B, w) for k, w in length.items())


def test_iterate_batches_matches_make_batch():
    task = make_task("sort")
    stream = iterate_batches(task, batch_format="prompt_answer", batch_size=B, seed=9, start_step=4)
    for step in range(4, 8):
        assert _equal(next(stream), _batch(task, "prompt_answer", seed=9, step=step))


@pytest.mark.parametrize("fmt", FORMATS)
def test_eval_batches_fixed_and_from_eval_split(fmt):
    task = make_task("reverse")
    batches = eval_batches(task, batch_format=fmt, batch_size=B, num_examples=50)
    assert len(batches) == 4  # ceil(50 / 16): rounds up to full batches
    again = eval_batches(task, batch_format=fmt, batch_size=B, num_examples=50)
    assert all(_equal(a, b) for a, b in zip(batches, again, strict=True))
    key = "inputs" if fmt == "seq2seq" else "tokens"
    for batch in batches:
        assert batch[key].shape == (B, batch_widths(task, batch_format=fmt)[key])
        for row in batch[key]:
            end = _row_ends(row) if fmt == "seq2seq" else list(row).index(SEP_ID)
            assert example_split(row[:end].tolist()) == "eval"
    other = eval_batches(task, batch_format=fmt, batch_size=B, num_examples=50, seed=1)
    assert not _equal(batches[0], other[0])


def test_train_batches_hold_only_train_examples():
    task = make_task("copy")
    for step in range(5):
        batch = _batch(task, "seq2seq", step=step, batch_size=64)
        for row in batch["inputs"]:
            assert example_split(row[: _row_ends(row)].tolist()) == "train"


def test_format_and_argument_errors():
    task = make_task("copy")
    with pytest.raises(
        ValueError, match=r"unknown batch format None \(valid formats: seq2seq, prompt_answer\)"
    ):
        _batch(task, None)
    with pytest.raises(
        ValueError, match=r"unknown batch format 'gpt' \(valid formats: seq2seq, prompt_answer\)"
    ):
        _batch(task, "gpt")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        _batch(task, "prompt_answer", split="dev")
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        _batch(task, "prompt_answer", seed=-1)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        _batch(task, "prompt_answer", batch_size=0)
    with pytest.raises(ValueError, match="num_examples must be an int >= 1"):
        eval_batches(task, batch_format="prompt_answer", batch_size=4, num_examples=0)
    no_length = make_task("associative_recall", num_keys=5, max_pairs=5)
    with pytest.raises(ValueError, match="has no 'length' split"):
        _batch(no_length, "prompt_answer", split="length")


def test_large_addition_batches_hold_correct_sums():
    """20 batches of 64 addition rows (prompt_answer): every answer is the sum of the two
    operands in its prompt, and the 20 batches are 20 different draws. (Speed is measured
    in bench/, not asserted here.)"""
    task = make_task("addition")
    seen = set()
    for step in range(20):
        batch = _batch(task, "prompt_answer", step=step, batch_size=64)
        assert batch["tokens"].shape[0] == 64
        for row, prompt_len in zip(batch["tokens"], batch["prompt_len"], strict=True):
            source, answer = split_prompt_answer(row, int(prompt_len))
            a, b = task.vocab.decode(source).replace(" ", "").split("+")
            assert task.vocab.decode(answer).replace(" ", "") == str(int(a) + int(b))
        seen.add(batch["tokens"].tobytes())
    assert len(seen) == 20


@pytest.mark.parametrize("batch_format", ["seq2seq", "prompt_answer"])
def test_rows_of_a_batch_equal_the_whole_batchs_rows(batch_format):
    """A process builds only its rows of a global batch; they are the whole batch's."""
    task = make_task("addition")
    args = dict(batch_format=batch_format, batch_size=8, seed=3, step=5)
    whole = make_batch(task, **args)
    for rows in (slice(0, 4), slice(4, 8), slice(2, 6)):
        part = make_batch(task, **args, rows=rows)
        assert part.keys() == whole.keys()
        for key in whole:
            np.testing.assert_array_equal(part[key], whole[key][rows], err_msg=key)
