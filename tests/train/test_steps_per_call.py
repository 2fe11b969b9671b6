"""``train.steps_per_call = K``: K steps in one jitted ``lax.scan`` give the params and the
``metrics.jsonl`` records of K calls of one step, bit for bit (both families, dropout on);
intervals that are not multiples of K are refused in one line; a resume realigns to the
calls; between log, eval and save steps nothing is fetched from the device."""

import contextlib
import os
import signal
import threading
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tfmjax.train.loop as loop
from tfmjax.checkpoint import load_for_inference, params_hash
from tfmjax.config import ConfigError, from_dict
from tfmjax.parallel.processes import to_host
from tfmjax.reporting.metrics_log import deterministic_part, read_records
from tfmjax.train.loop import call_spans, train
from tfmjax.train.resume import config_changes


def experiment(family, workdir, *, steps=20, log=10, every=10, **train_kw):
    return from_dict(
        {
            "model": {
                "family": family,
                "vocab_size": 16,
                "d_model": 16,
                "num_heads": 2,
                "d_ff": 32,
                "num_layers": 1,
                "dropout_rate": 0.1,
                "tie_embeddings": False,
            },
            # one schedule whatever train.steps: the tests' runs of one family and K then
            # compile the same program (train.steps alone would change a schedule constant)
            "optim": {"learning_rate": 3e-3, "warmup_steps": 2, "schedule_steps": 20},
            "data": {
                "task": "reverse",
                "task_params": {"num_symbols": 5, "max_len": 5},
                "batch_size": 8,
                "eval_examples": 8,
            },
            "train": {
                "steps": steps,
                "log_every": log,
                "eval_every": every,
                "checkpoint_every": every,
                "workdir": str(workdir),
                **train_kw,
            },
        },
        name=f"calls_{family}",
    )


def run(exp, **kw):
    return train(exp, progress=False, plot=False, stream=open(os.devnull, "w"), **kw)


def records(workdir):
    """The records apart from timing, and apart from the config changes a resume notes."""
    return [
        deterministic_part(r)
        for r in read_records(workdir / "metrics.jsonl")
        if r["split"] != "config"
    ]


def same_run(a, b) -> None:
    """Bit-identical params, and the same records apart from timing."""
    assert params_hash(load_for_inference(a)[1]) == params_hash(load_for_inference(b)[1])
    assert records(a) == records(b)


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_ten_steps_a_call_give_the_run_of_one_step_a_call(tmp_path, family):
    """K = 1 without prefetch (the loop as it was) and K = 10 with it: the same params bit
    for bit and the same records (loss, accuracies, grad norm, lr, evals) at 10 and 20."""
    run(experiment(family, tmp_path / "one", steps_per_call=1, prefetch=False))
    run(experiment(family, tmp_path / "ten", steps_per_call=10, prefetch=True))
    same_run(tmp_path / "one", tmp_path / "ten")
    steps = [(r["split"], r["step"]) for r in records(tmp_path / "ten")]
    assert steps == [("train", 10), ("eval", 10), ("train", 20), ("eval", 20)]


def test_a_resume_realigns_to_the_calls_and_a_short_call_ends_the_run(tmp_path):
    """A run of the default K ("auto": 1 on this CPU) stopped at step 3, resumed with K = 4
    over 10 steps: calls 3-4, 4-8 and 8-10 (one step, four, two); the end equals a straight
    K = 1 run."""
    kw = dict(steps=10, log=4, every=4)
    run(experiment("decoder_only", tmp_path / "straight", **kw))

    def sigterm_at_3(done):
        if done == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    broken = tmp_path / "broken"
    assert run(experiment("decoder_only", broken, **kw), on_step=sigterm_at_3)["step"] == 3
    lines = []
    result = train(
        experiment("decoder_only", broken, steps_per_call=4, **kw),
        progress=False,
        plot=False,
        stream=open(os.devnull, "w"),
        on_step=lines.append,
    )
    assert result["step"] == 10 and lines == list(range(4, 11))
    assert call_spans(3, 10, 4) == [(3, 4), (4, 8), (8, 10)]
    same_run(tmp_path / "straight", broken)
    noted = [r for r in read_records(broken / "metrics.jsonl") if r["split"] == "config"]
    changes = ["train.steps_per_call 'auto' -> 4"]
    assert noted == [{"step": 3, "split": "config", "changes": changes}]


def test_intervals_must_be_multiples_of_steps_per_call():
    with pytest.raises(ConfigError) as info:
        experiment("decoder_only", "w", steps_per_call=4, log=10, every=8)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("train.steps_per_call=4 is invalid: train.log_every=10 must be")
    with pytest.raises(ConfigError, match=r"train.eval_every=6, train.checkpoint_every=6 must"):
        experiment("decoder_only", "w", steps_per_call=4, log=4, every=6)
    with pytest.raises(ConfigError, match=r"train.steps_per_call=0 is invalid: must be > 0"):
        experiment("decoder_only", "w", steps_per_call=0)
    assert call_spans(0, 7, 3) == [(0, 3), (3, 6), (6, 7)] and call_spans(5, 5, 2) == []
    with pytest.raises(ConfigError, match=r"train.steps_per_call='fast' is invalid: must be one"):
        experiment("decoder_only", "w", steps_per_call="fast")


@pytest.mark.parametrize(
    "log, every, backend, calls",
    [(10, 10, "cpu", 1), (10, 10, "gpu", 10), (50, 250, "gpu", 10), (64, 256, "tpu", 16)]
    + [(48, 96, "gpu", 16), (7, 21, "gpu", 7), (34, 17, "gpu", 1)],
)
def test_auto_runs_up_to_16_steps_a_call_between_records_on_accelerators(
    log, every, backend, calls
):
    """ "auto" (the default): 1 a call on a CPU; on a GPU or TPU the largest K <= 16 that
    divides the log, eval and save intervals, so records still fall between calls."""
    train = experiment("decoder_only", "w", log=log, every=every).train
    assert train.steps_per_call == "auto" and train.steps_per_call_on(backend) == calls
    assert all(n % calls == 0 for n in (log, every))
    assert (
        experiment("decoder_only", "w", steps_per_call=2, log=4).train.steps_per_call_on("gpu") == 2
    )


def test_an_older_checkpoint_without_the_new_fields_resumes_unchanged():
    """A config saved before steps_per_call and prefetch existed: they load as their
    defaults ("auto", 1 a call on this CPU, and building ahead: the same steps and batches),
    a resume sees no change; changing steps_per_call or prefetch on a resume is allowed (the
    same steps)."""
    now = experiment("decoder_only", "w")
    saved = now.to_dict()
    del saved["train"]["steps_per_call"], saved["train"]["prefetch"]
    old = from_dict(saved)
    assert old.train.steps_per_call == "auto" and old.train.prefetch is True
    assert old.train.steps_per_call_on("cpu") == 1
    assert config_changes(saved, now) == ([], [])
    faster = experiment("decoder_only", "w", steps_per_call=2, prefetch=False)
    assert config_changes(saved, faster) == (
        ["train.prefetch <missing> -> False", "train.steps_per_call <missing> -> 2"],
        [],
    )
    assert config_changes(now.to_dict(), faster)[1] == []


class _FetchSpy:
    """Every fetch of a jax.Array's value that Python code makes while armed: through
    ``ArrayImpl._value`` (``jax.device_get``, ``float``, ``int``, ``bool``, formatting,
    ``tolist``, ``to_host``) and ``np.asarray`` / ``np.array`` of a jax.Array. Needed on
    XLA:CPU, where jax 0.10's device-to-host transfer guard never fires (the array's host
    buffer is handed out without a copy); on GPU and TPU the guard itself raises."""

    def __init__(self, monkeypatch):
        from jax._src import array

        self.armed, self.fetches = False, []
        value = array.ArrayImpl.__dict__["_value"]
        monkeypatch.setattr(array.ArrayImpl, "_value", property(self._wrap(value.fget)))
        for name in ("asarray", "array"):
            monkeypatch.setattr(np, name, self._wrap(getattr(np, name), only_jax=True))

    def _wrap(self, fn, only_jax=False):
        def spied(x, *args, **kw):
            if self.armed and (not only_jax or isinstance(x, jax.Array)):
                self.fetches.append("".join(traceback.format_stack(limit=8)[:-1]))
            return fn(x, *args, **kw)

        return spied

    @contextlib.contextmanager
    def guard(self):
        with jax.transfer_guard_device_to_host("disallow"):
            self.armed = True
            try:
                yield
            finally:
                self.armed = False


@pytest.mark.parametrize("k", [1, 2])
def test_no_device_value_is_fetched_between_log_eval_and_save_steps(tmp_path, monkeypatch, k):
    """Every call of steps (batches taken, steps run, on_step called) under a device-to-host
    transfer guard and the spy; logs (4, 8), evals and saves (8) come between the calls.
    Nothing is fetched: the on_step hook's own fetch, a check that the spy sees one (which
    the guard blocks on GPU and TPU), is the only one recorded."""
    spy = _FetchSpy(monkeypatch)
    monkeypatch.setattr(loop, "STEP_GUARD", spy.guard)
    probe = jnp.arange(3.0) * 2
    guarded = []

    def on_step(done):
        guarded.append(spy.armed and jax.config.jax_transfer_guard_device_to_host == "disallow")
        if done == 1:
            assert threading.current_thread() is threading.main_thread()
            with contextlib.suppress(Exception):  # GPU, TPU: the guard raises
                np.asarray(probe)  # the control: a fetch the spy must see

    exp = experiment("encoder_decoder", tmp_path, steps=8, log=4, every=8, steps_per_call=k)
    assert run(exp, on_step=on_step)["step"] == 8
    assert guarded == [True] * 8
    assert spy.fetches and all("np.asarray(probe)" in f for f in spy.fetches), spy.fetches
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [4, 8, 8]


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_calls_of_one_two_and_four_steps_give_the_same_bits(family):
    """``train_steps`` on batches 0-3 in calls of one step, of two and of four: the same state
    (params, Adam moments, log window) and per-step metrics, bit for bit, dropout on. (A call
    of one step is the case XLA would compile differently: see make_train_steps.)"""
    from tfmjax.train.run import build_run
    from tfmjax.train.state import create_state

    run = build_run(experiment(family, "unused", steps=4, log=4, every=4))
    bits = lambda tree: [  # noqa: E731
        (x.dtype, x.shape, x.tobytes()) for x in map(np.asarray, jax.tree.leaves(to_host(tree)))
    ]
    ends = []
    for n in (1, 2, 4):
        state = create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings)
        metrics = []
        for first in range(0, 4, n):
            state, stacked = run.train_steps(state, run.device_batches(first, first + n))
            metrics += [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)]
        ends.append((bits(state), bits(metrics)))
    assert ends[0] == ends[1] == ends[2]
