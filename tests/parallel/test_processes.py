"""Two processes x 4 CPU devices on localhost, joined through ``jax.distributed``, train like
one process with 8 devices; they save and resume, and ``eval.py`` on both evaluates their
checkpoint on the same mesh like one device; a lost peer ends the other in bounded time.

Each process is ``python train.py`` in a subprocess (a free port, bounded timeouts); the
one-process reference trains in this process, whose 8 simulated devices come from conftest.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tfmjax.checkpoint import load_for_inference
from tfmjax.config import load
from tfmjax.evaluation.report import evaluate_checkpoint
from tfmjax.generate import main as generate_main
from tfmjax.parallel.processes import LOST_PEER_EXIT
from tfmjax.train import train

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/reverse_decoder.toml"
# Small and quick to compile; every split axis divides by 2; the constant schedule does not
# depend on train.steps, so 4 steps resumed to 6 equal 6 straight steps.
OVERRIDES = [
    "model.d_model=32",
    "model.num_heads=4",
    "model.d_ff=64",
    "model.num_layers=1",
    "model.max_len=32",
    "data.batch_size=16",
    "data.eval_examples=16",
    "optim.schedule=constant",
    "optim.warmup_steps=1",
    "train.log_every=1",
    "train.eval_every=100",
    "train.checkpoint_every=2",
    "mesh.data=2",
    "mesh.fsdp=2",
    "mesh.tensor=2",
]
PEER_TIMEOUT = 10  # generous: a loaded 2-core machine can starve a process for seconds
RUN_TIMEOUT = 240  # seconds for a whole two-process run (start-up and compiles included)

pytestmark = pytest.mark.xdist_group("processes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(args: list[str], workdir: Path, port: int, log: str = "") -> list[subprocess.Popen]:
    """Processes 0 and 1 of ``python ARGS``, 4 CPU devices each; output goes to
    ``workdir.pI.log`` (``workdir.LOG.pI.log`` with a ``log`` name)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_NUM_CPU_DEVICES"] = "4"
    workdir.mkdir(parents=True, exist_ok=True)
    procs = []
    for index in range(2):
        cmd = [
            sys.executable,
            *args,
            f"--coordinator=localhost:{port}",
            "--num-processes=2",
            f"--process-id={index}",
            f"--peer-timeout={PEER_TIMEOUT}",
        ]
        out = (workdir.parent / f"{workdir.name}{log and '.' + log}.p{index}.log").open("w")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def start(workdir: Path, steps: int, port: int, *extra: str) -> list[subprocess.Popen]:
    """Processes 0 and 1 of one training run; output goes to workdir.pI.log."""
    args = ["train.py", CONFIG, *OVERRIDES, *extra, f"train.steps={steps}"]
    args.append(f"train.workdir={workdir}")
    return launch([*args, "--progress=lines"], workdir, port)


def output(workdir: Path, index: int, log: str = "") -> str:
    return (workdir.parent / f"{workdir.name}{log and '.' + log}.p{index}.log").read_text()


def finish(procs, workdir: Path, log: str = "") -> None:
    try:
        codes = [p.wait(timeout=RUN_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], output(workdir, 0, log)[-3000:] + output(workdir, 1, log)[-3000:]


def past_first_step(procs, workdir: Path) -> None:
    """Wait until process 0 has logged a step (so both are training), within the bound."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while "train step" not in output(workdir, 0):
        assert time.monotonic() < deadline, output(workdir, 0)[-3000:]
        assert all(p.poll() is None for p in procs), output(workdir, 0)[-3000:]
        time.sleep(0.5)


def train_records(workdir: Path) -> dict[int, float]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["split"] == "train"}


def test_two_processes_train_like_one_and_resume(tmp_path):
    reference = tmp_path / "one"
    train(load(CONFIG, [*OVERRIDES, "train.steps=6", f"train.workdir={reference}"]), plot=False)
    want = train_records(reference)

    both = tmp_path / "two"
    finish(start(both, 4, free_port()), both)
    first = output(both, 0)
    assert "mesh data=2 x fsdp=2 x tensor=2: 8 of 8 cpu devices" in first
    assert "experiment" not in output(both, 1)  # only process 0 prints
    finish(start(both, 6, free_port()), both)  # resumes from the step-4 checkpoint
    assert "resumed from checkpoint step 4" in output(both, 0)

    got = train_records(both)
    assert sorted(got) == sorted(want) == list(range(1, 7))
    np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=1e-5)
    _, got_params, step = load_for_inference(both)
    _, want_params, _ = load_for_inference(reference)
    assert step == 6
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got_params), jax.tree.leaves(want_params), strict=True
    ):
        # key/bias: its gradient is zero up to rounding (see test_mesh), so within steps x lr.
        atol = 6 * 3e-3 if "key" in jax.tree_util.keystr(path) else 1e-6
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol, err_msg=jax.tree_util.keystr(path))

    # eval.py on both processes: the params restored onto their data=2 x fsdp=2 x tensor=2
    # mesh (the checkpoint's own) give the one-device report; process 0 alone writes it.
    report = tmp_path / "report.json"
    args = ["eval.py", str(both), "--rows", "16", "--out", str(report)]
    finish(launch(args, both, free_port(), "eval"), both, "eval")
    got = json.loads(report.read_text())
    want = evaluate_checkpoint(both, num_rows=16)  # one device
    assert got["mesh"] == "data=2 x fsdp=2 x tensor=2"
    assert want["mesh"] == "data=1 x fsdp=1 x tensor=1"
    for key in ("loss", "perplexity", "token_accuracy", "exact_match"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    assert got["examples"] == want["examples"] and len(want["examples"]) == 16
    said = [output(both, i, "eval") for i in range(2)]
    assert "exact_match" in said[0] and "exact_match" not in said[1] and "wrote" not in said[1]

    # python -m tfmjax.generate on both processes: greedy ids on the same mesh equal one
    # device's (this process, which sees 8 devices but puts no mesh in force); process 0 prints.
    prompts = ["c a b", "b b a c"]
    argv = [str(both), *(f for p in prompts for f in ("--input", p)), "--max-new-tokens", "8"]
    finish(launch(["-m", "tfmjax.generate", *argv], both, free_port(), "gen"), both, "gen")
    with contextlib.redirect_stdout(io.StringIO()) as one_device:
        assert generate_main([*argv, "mesh.data=1", "mesh.fsdp=1", "mesh.tensor=1"]) == 0
    want_lines = one_device.getvalue().splitlines()
    assert len(want_lines) == len(prompts) and all(" -> " in line for line in want_lines)
    got_lines = [line for line in output(both, 0, "gen").splitlines() if " -> " in line]
    assert got_lines == want_lines
    assert " -> " not in output(both, 1, "gen")


def test_two_processes_with_two_steps_a_call_train_like_one_step_a_call(tmp_path):
    """steps_per_call=2 with batches built ahead: each process stacks its own rows of two
    batches into [2, 16, ...] global arrays; the records equal a one-process run of one step
    a call (within float rounding across the process boundary, as above)."""
    calls = ["train.log_every=2", "train.checkpoint_every=2"]
    reference = tmp_path / "one"
    overrides = [*OVERRIDES, *calls, "train.steps=4", f"train.workdir={reference}"]
    train(load(CONFIG, overrides), plot=False)
    both = tmp_path / "two"
    finish(start(both, 4, free_port(), *calls, "train.steps_per_call=2"), both)
    assert "compiled and ran the first 2 steps" in output(both, 0)
    got, want = train_records(both), train_records(reference)
    assert sorted(got) == sorted(want) == [2, 4]
    np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=1e-5)


@pytest.mark.parametrize("lost", [1, 0], ids=["worker_lost", "coordinator_lost"])
def test_a_lost_process_ends_the_other_within_the_bound(tmp_path, lost):
    """Kill one process mid-run: the other exits non-zero within the peer timeout (plus
    slack), with our line when it can still speak (a lost worker) and JAX's own when the
    coordinator, which hosts JAX's runtime, is the one lost."""
    workdir = tmp_path / "run"
    procs = start(workdir, 100_000, free_port())
    survivor = procs[1 - lost]
    try:
        past_first_step(procs, workdir)
        procs[lost].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = survivor.wait(timeout=PEER_TIMEOUT + 30)
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    said = output(workdir, 1 - lost)
    assert code != 0 and took < PEER_TIMEOUT + 30, (code, took, said[-3000:])
    if lost == 1:
        assert code == LOST_PEER_EXIT, said[-3000:]
        assert f"lost process 1: no heartbeat for {PEER_TIMEOUT} s" in said
    else:
        assert "another task died" in said


def test_sigterm_to_one_process_stops_both_after_the_same_step_saved(tmp_path):
    workdir = tmp_path / "run"
    procs = start(workdir, 100_000, free_port())
    try:
        past_first_step(procs, workdir)
        procs[1].send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], output(workdir, 0)[-3000:] + output(workdir, 1)[-3000:]
    said = [line for line in output(workdir, 0).splitlines() if line.startswith("SIGTERM: saved")]
    assert len(said) == 1, output(workdir, 0)[-3000:]
    step = int(said[0].split("saved step ")[1].split(";")[0])
    _, _, loaded = load_for_inference(workdir)
    assert loaded == step


def _args(*argv):
    import argparse

    from tfmjax.parallel import processes

    parser = argparse.ArgumentParser()
    processes.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--num-processes=2", "--process-id=2"], {}, "--process-id=2 must be in 0..1"),
        (["--num-processes=0"], {}, "--num-processes=0 must be >= 1"),
        (["--coordinator=h:1", "--peer-timeout=0"], {}, "--peer-timeout=0 must be > 0"),
        ([], {"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is not an integer"),
    ],
)
def test_bad_process_flags_are_one_line_config_errors(monkeypatch, argv, env, message):
    from tfmjax.config import ConfigError
    from tfmjax.parallel import processes

    for name in processes.ENV.values():
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")) as err:
        processes.join(_args(*argv))
    assert "\n" not in str(err.value)


def test_one_process_without_flags_and_host_copies(monkeypatch):
    from tfmjax.parallel import processes

    for name in processes.ENV.values():
        monkeypatch.delenv(name, raising=False)
    assert processes.join(_args()) is None
    assert processes.is_main() and processes.tag() == ""
    assert processes.any_process(7) == 7
    tree = {"a": jax.numpy.arange(6).reshape(2, 3), "b": [np.float32(1.5)]}
    host = processes.to_host(tree)
    assert isinstance(host["a"], np.ndarray)
    np.testing.assert_array_equal(host["a"], np.arange(6).reshape(2, 3))
    processes.end(None, 0)  # one process: nothing to tell, no exit


class _FakeStore:
    """The runtime's key-value store and barrier, in memory: peer 1 beats while ``alive``."""

    def __init__(self, barrier_meets: bool, peer_alive: bool):
        self.values: dict[str, str] = {}
        self.barrier_meets, self.peer_alive, self.peer_beat = barrier_meets, peer_alive, 0

    def key_value_set(self, key, value, allow_overwrite=False):
        self.values[key] = value

    def key_value_dir_get(self, prefix):
        if self.peer_alive:
            self.peer_beat += 1
            self.values["tfmjax/beat/1"] = str(self.peer_beat)
        return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

    def wait_at_barrier(self, name, timeout_ms):
        if not self.barrier_meets:
            time.sleep(timeout_ms / 1000)
            raise RuntimeError("DEADLINE_EXCEEDED: barrier timed out")


@pytest.mark.parametrize(
    "barrier_meets, peer_alive, together, lost",
    [(True, True, True, []), (False, True, False, []), (False, False, False, [1])],
    ids=["all_failed", "failed_alone", "after_a_lost_peer"],
)
def test_an_error_is_settled_before_it_is_printed(barrier_meets, peer_alive, together, lost):
    """settle_failure, the step before an error line with several processes: an error all
    processes hit meets at the barrier; one of this process alone ends without waiting for a
    verdict; one that follows a peer's silence waits until the watch declares the peer lost
    (here recorded instead of exiting 3)."""
    from tfmjax.parallel.processes import PeerWatch

    watch = PeerWatch(
        0, 2, timeout=1.0, interval=0.05, client=_FakeStore(barrier_meets, peer_alive)
    )
    declared = []
    watch._lost = lambda peer, who: declared.append(peer) or watch._stop.set()  # not exit 3
    watch.start()
    try:
        watch.settle_failure(wait=0.3)
    finally:
        watch._stop.set()
    assert watch.failed_together is together
    assert declared == lost
