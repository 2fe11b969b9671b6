"""Batches built ahead on a background thread: the same batches in the same order, at most
two ahead, a build error raised where building in the loop would have raised it, and no
thread left behind: after a run, after an error while building a batch, after a stop."""

import os
import signal
import threading
import time

import pytest

from tfmjax.config import from_dict
from tfmjax.models import InputError
from tfmjax.train.loop import train
from tfmjax.train.prefetch import Prefetcher


def experiment(workdir, steps=4):
    return from_dict(
        {
            "model": {"family": "decoder_only", "vocab_size": 16, "d_model": 16,
                      "num_heads": 2, "d_ff": 32, "num_layers": 1},
            "optim": {"warmup_steps": 1},
            "data": {"task": "reverse", "task_params": {"num_symbols": 5, "max_len": 5},
                     "batch_size": 8, "eval_examples": 8},
            "train": {"steps": steps, "log_every": 2, "eval_every": steps,
                      "checkpoint_every": steps, "workdir": str(workdir)},
        },
        name="prefetch",
    )  # fmt: skip


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "batch-prefetch"]


class Boom(Exception):
    pass


def test_results_come_in_order_and_the_thread_is_at_most_two_ahead():
    built = []

    def build(item):
        built.append(item)
        return item * 10

    with Prefetcher(build, range(20)) as batches:
        for item in range(20):
            time.sleep(0.002)  # a slow consumer: the thread fills the queue and waits
            assert batches.take(item) == item * 10
            assert len(built) <= item + 3  # this one, one in the queue, one being put
    assert built == list(range(20)) and not _threads()


def test_a_build_error_is_raised_at_its_item_and_the_thread_ends():
    error = Boom("batch 3: one line")

    def build(item):
        if item == 3:
            raise error
        return item

    with Prefetcher(build, range(10)) as batches:
        assert [batches.take(i) for i in range(3)] == [0, 1, 2]
        with pytest.raises(Boom) as info:
            batches.take(3)
        assert info.value is error
        assert not batches.running  # it ended with the error
    assert not _threads()


def test_close_stops_a_thread_that_waits_with_a_full_queue():
    with Prefetcher(lambda item: item, range(1000)) as batches:
        assert batches.take(0) == 0
        time.sleep(0.05)  # the queue is full: the thread waits on it
        assert batches.running
    assert not batches.running and not _threads()


def test_without_background_each_item_is_built_in_the_callers_thread():
    where = []
    with Prefetcher(lambda item: where.append(threading.current_thread()) or item, range(3),
                    background=False) as batches:  # fmt: skip
        assert [batches.take(i) for i in range(3)] == [0, 1, 2]
    assert where == [threading.main_thread()] * 3 and not _threads()


def _quiet(exp, **kw):
    return train(exp, progress=False, plot=False, stream=open(os.devnull, "w"), **kw)


def test_no_thread_outlives_a_run_a_build_error_or_a_stop(tmp_path, monkeypatch):
    """One config (one compile), four runs: the thread runs while the steps do and is gone
    when train() returns, raises or stops."""
    seen = []

    def watch(done):
        seen.append(len(_threads()))

    result = _quiet(experiment(tmp_path / "done"), on_step=watch)
    assert result["step"] == 4 and not _threads()
    assert seen[0] == 1  # building ahead while step 1 ran

    def stop_at_2(done):
        if done == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    result = _quiet(experiment(tmp_path / "stop"), on_step=stop_at_2)
    assert result == {**result, "step": 2, "stopped": True} and not _threads()

    def crash(done):
        raise Boom("on_step")

    with pytest.raises(Boom):
        _quiet(experiment(tmp_path / "crash"), on_step=crash)
    assert not _threads()

    import tfmjax.data.sources as sources

    real = sources.make_batch

    def bad_batch_3(task, **kw):
        batch = real(task, **kw)
        if kw["step"] == 3:
            batch = dict(batch, tokens=batch["tokens"].copy())
            batch["tokens"][0, 0] = 16  # model.vocab_size: one past the last id
        return batch

    monkeypatch.setattr(sources, "make_batch", bad_batch_3)
    done = []
    with pytest.raises(InputError, match=r"tokens has token id 16 at index \[0, 0\]") as info:
        _quiet(experiment(tmp_path / "bad"), on_step=done.append)
    assert "\n" not in str(info.value) and done == [1, 2, 3] and not _threads()
