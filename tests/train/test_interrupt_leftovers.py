"""A run stopped before it saved anything leaves its workdir as it found it, and a second
Ctrl-C says truly what is saved.

In process: a signal already taken when ``train`` starts stops it before the first step
(the path of a Ctrl-C while building or compiling), after it made its workdir,
``checkpoints/`` and ``metrics.jsonl``. Through ``train.py``: two Ctrl-C while the first
step compiles, on a fresh workdir.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfmjax.checkpoint.lock import LOCK_FILE
from tfmjax.config import from_dict
from tfmjax.reporting.metrics_log import read_records
from tfmjax.train import loop
from tfmjax.train.stopping import Interrupted, StopSignals
from tfmjax.train.tidy import Created

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 600  # a hang guard, not a speed limit
RAW = {
    "model": {"family": "decoder_only", "vocab_size": 16, "d_model": 16, "num_heads": 2,
              "d_ff": 32, "num_layers": 1},
    "optim": {"learning_rate": 3e-3, "warmup_steps": 2},
    "data": {"task": "copy", "task_params": {"num_symbols": 5, "max_len": 4},
             "batch_size": 8, "eval_examples": 8},
    "train": {"steps": 2, "log_every": 1, "eval_every": 2, "checkpoint_every": 2},
}  # fmt: skip


def experiment(workdir: Path):
    raw = json.loads(json.dumps(RAW))
    raw["train"]["workdir"] = str(workdir)
    return from_dict(raw, name="leftovers")


def interrupted_train(workdir: Path) -> str:
    """``train`` with a Ctrl-C already taken: stopped before its first step."""
    with StopSignals() as stop:
        stop.requested = "SIGINT"
        with pytest.raises(Interrupted) as err:
            loop.train(
                experiment(workdir), progress=False, plot=False, stream=open(os.devnull, "w")
            )
    return str(err.value)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_fresh_workdir_is_removed_again(tmp_path):
    workdir = tmp_path / "run"
    assert "interrupted before the first step: nothing saved" in interrupted_train(workdir)
    assert not workdir.exists()


def test_an_empty_workdir_given_stays_empty(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    interrupted_train(workdir)
    assert tree(workdir) == ["notes.txt"]


def test_a_run_that_saved_keeps_everything(tmp_path):
    workdir = tmp_path / "run"
    loop.train(experiment(workdir), progress=False, plot=False, stream=io.StringIO())
    before = tree(workdir)
    records = read_records(workdir / "metrics.jsonl")
    assert "checkpoints/2" in before and records
    assert "(checkpoint step 2 is kept)" in interrupted_train(workdir)
    assert tree(workdir) == before and read_records(workdir / "metrics.jsonl") == records


def test_a_second_ctrl_c_tidies_and_names_the_saved_step(tmp_path):
    """What ``train.py``'s at-once exit runs (``on_exit_now``), without exiting: it removes
    the lock file and the empty parts the run made, and says what is saved."""
    workdir = tmp_path / "run"
    created = Created(workdir)
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "metrics.jsonl").touch()
    (workdir / LOCK_FILE).write_text("{}")
    with StopSignals() as stop, loop._tidied_on_failure(created, workdir / LOCK_FILE):
        assert stop.on_exit_now() == "nothing was saved"
    assert stop.on_exit_now is None and not workdir.exists()

    (workdir / "checkpoints" / "4").mkdir(parents=True)
    (workdir / "checkpoints" / "6.orbax-checkpoint-tmp").mkdir()  # a save cut short
    (workdir / "metrics.jsonl").touch()
    with StopSignals() as stop, loop._tidied_on_failure(created, workdir / LOCK_FILE):
        assert stop.on_exit_now() == "the last saved checkpoint (step 4) is intact"
    assert tree(workdir) == ["checkpoints", "checkpoints/4", "checkpoints/6.orbax-checkpoint-tmp"]


def test_train_py_two_ctrl_c_while_compiling_say_nothing_was_saved(tmp_path):
    workdir = tmp_path / "run"
    config = tmp_path / "leftovers.toml"
    config.write_text(
        "".join(f"[{s}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in vals.items()
                                     if not isinstance(v, dict))
                for s, vals in RAW.items())
        + "[data.task_params]\nnum_symbols = 5\nmax_len = 4\n"
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "train.py"), str(config), f"train.workdir={workdir}",
           "--progress", "lines"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("experiment "):  # the header: the first step compiles next
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, err
    assert err.strip() == "second Ctrl-C: exiting now; nothing was saved"
    assert not workdir.exists()


def test_a_run_refused_by_the_lock_touches_nothing_of_the_run_that_holds_it(tmp_path, monkeypatch):
    """Only the lock's holder tidies: a run refused by the lock leaves the parts another run
    made after this one looked (empty ones too: that run is just starting) where they are."""
    from tfmjax.checkpoint import lock as lock_module

    workdir = tmp_path / "run"

    def taken_meanwhile(self):
        (workdir / "checkpoints").mkdir(parents=True)
        (workdir / "metrics.jsonl").touch()
        raise lock_module.WorkdirLocked(f"{workdir} is in use by another training run")

    monkeypatch.setattr(lock_module.WorkdirLock, "take", taken_meanwhile)
    with pytest.raises(lock_module.WorkdirLocked):
        loop.train(experiment(workdir), progress=False, plot=False, stream=io.StringIO())
    assert tree(workdir) == ["checkpoints", "metrics.jsonl"]
