"""One training run per workdir: the lock refuses a second run in one line and takes over a
lock that a killed run left behind; readers never take it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfmjax.checkpoint.lock import LOCK_FILE, WorkdirLock, WorkdirLocked

ROOT = Path(__file__).resolve().parents[2]

HOLD = textwrap.dedent(
    """
    import sys, time
    from tfmjax.checkpoint.lock import WorkdirLock
    with WorkdirLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


def _holder(workdir: Path) -> subprocess.Popen:
    """A process that holds ``workdir``'s lock until it is killed (once it printed "held")."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(workdir)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_is_refused_naming_the_holder(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(WorkdirLocked) as err:
            WorkdirLock(tmp_path).take()
        line = str(err.value)
        assert "\n" not in line
        assert f"PID {holder.pid} on host {socket.gethostname()}" in line
        assert "in use by another training run" in line and "train.workdir" in line
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    holder = _holder(tmp_path)
    holder.send_signal(signal.SIGKILL)  # no cleanup: the file stays, the flock goes
    holder.wait()
    assert (tmp_path / LOCK_FILE).exists()
    with WorkdirLock(tmp_path) as lock:
        assert lock.taken_over is not None and f"PID {holder.pid}" in lock.taken_over
        info = json.loads((tmp_path / LOCK_FILE).read_text())
        assert info["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()  # released: removed


def test_the_lock_is_exclusive_within_a_process_and_free_after_release(tmp_path):
    with WorkdirLock(tmp_path) as lock:
        assert lock.taken_over is None
        with pytest.raises(WorkdirLocked):
            WorkdirLock(tmp_path).take()
    with WorkdirLock(tmp_path) as again:  # released cleanly: no takeover to report
        assert again.taken_over is None


def test_train_refuses_a_locked_workdir_and_says_so_on_takeover(tmp_path):
    """The loop takes the lock before touching the workdir: a held lock is a CheckpointError
    (train.py: one line, exit 2) and nothing is written; a stale one is taken over with a
    line on the console."""
    import io

    from tfmjax.config import from_dict
    from tfmjax.train.loop import train

    small = {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_layers": 1, "vocab_size": 16}
    exp = from_dict(
        {
            "model": small,
            "optim": {"warmup_steps": 1},
            "data": {"task": "copy", "batch_size": 4, "eval_examples": 4},
            "train": {"steps": 2, "eval_every": 2, "workdir": str(tmp_path / "run")},
        },
        name="locked",
    )
    (tmp_path / "run").mkdir()
    holder = _holder(tmp_path / "run")
    try:
        with pytest.raises(WorkdirLocked, match="in use by another training run"):
            train(exp, progress=False, stream=io.StringIO(), plot=False)
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_FILE]
    finally:
        holder.kill()
        holder.wait()
    out = io.StringIO()
    result = train(exp, progress=False, stream=out, plot=False)
    assert result["step"] == 2
    assert f"took over the training lock of PID {holder.pid}" in out.getvalue()
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_a_filesystem_without_locks_runs_unlocked_and_says_why(tmp_path, monkeypatch):
    """flock refused outright (ENOLCK on some network mounts) is not "held by another run":
    the lock says why and the run goes on."""
    import errno

    import tfmjax.checkpoint.lock as lock_module

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(lock_module.fcntl, "flock", no_locks)
    with WorkdirLock(tmp_path) as lock:
        assert lock.unsupported == f"{tmp_path} cannot be locked ({os.strerror(errno.ENOLCK)})"
        assert lock.taken_over is None
