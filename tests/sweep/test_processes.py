"""The process pool with a stand-in child (a small script, not train.py): slots, pinning, and
a signal forwarded once to each child in flight while no new child starts."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tfmjax.sweep.processes import Job, default_cores, run_pool

CHILD = """
import json, os, signal, sys, time
out, seconds = sys.argv[1], float(sys.argv[2])
got = []
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda signum, frame: got.append(signum))
start = time.time()
open(out + ".ready", "w").close()
while time.time() < start + seconds and not got:
    time.sleep(0.01)
cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
json.dump({"start": start, "end": time.time(), "cores": cores, "signals": got}, open(out, "w"))
"""


def _jobs(tmp_path: Path, n: int, seconds: float) -> list[Job]:
    return [
        Job(f"job{i}", [str(tmp_path / f"out{i}.json"), str(seconds)], tmp_path / f"w{i}")
        for i in range(n)
    ]


def _command(tmp_path: Path) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script)]


def _result(job: Job) -> dict:
    return json.loads(Path(job.argv[0]).read_text())


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_two_slots_each_pinned_to_its_core(tmp_path):
    jobs, started, ended = _jobs(tmp_path, 3, 0.3), [], []
    cores = default_cores()
    stopped = run_pool(
        jobs,
        slots=2,
        cores=cores,
        on_start=started.append,
        on_end=ended.append,
        command=_command(tmp_path),
        poll_sec=0.01,
    )
    assert stopped is None
    assert [j.name for j in started] == ["job0", "job1", "job2"] and len(ended) == 3
    results = [_result(job) for job in jobs]
    assert jobs[0].core == cores[0] and jobs[1].core == cores[1 % len(cores)]
    for job, result in zip(jobs, results, strict=True):
        assert job.returncode == 0 and result["cores"] == [job.core]
        assert (job.workdir / "train.log").exists()
    # the third starts only once a slot is free: after one of the first two ended
    assert results[2]["start"] >= min(results[0]["end"], results[1]["end"])


def test_a_signal_is_forwarded_once_to_each_child_and_nothing_new_starts(tmp_path):
    jobs = _jobs(tmp_path, 3, 60.0)
    ready = [Path(job.argv[0] + ".ready") for job in jobs[:2]]

    def stop_when_ready():
        while not all(p.exists() for p in ready):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_when_ready, daemon=True).start()
    stopped = run_pool(
        jobs,
        slots=2,
        cores=None,
        on_start=lambda job: None,
        on_end=lambda job: None,
        command=_command(tmp_path),
        poll_sec=0.01,
    )
    assert stopped == signal.SIGTERM
    for job in jobs[:2]:
        assert job.returncode == 0 and _result(job)["signals"] == [signal.SIGTERM]
    assert jobs[2].returncode is None and not Path(jobs[2].argv[0]).exists()
    assert signal.getsignal(signal.SIGTERM) == before  # the pool's handler is gone


def test_no_job_starts_once_keep_starting_says_no(tmp_path):
    jobs, started = _jobs(tmp_path, 3, 0.05), []
    stopped = run_pool(
        jobs,
        slots=1,
        cores=None,
        on_start=started.append,
        on_end=lambda job: None,
        command=_command(tmp_path),
        keep_starting=lambda: len(started) < 2,  # a budget spent after two starts
        poll_sec=0.01,
    )
    assert stopped is None and [j.name for j in started] == ["job0", "job1"]
    assert [j.returncode for j in jobs] == [0, 0, None]
    assert not Path(jobs[2].argv[0]).exists()
