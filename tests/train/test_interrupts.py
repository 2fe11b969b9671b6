"""SIGINT / SIGTERM at any moment of ``train.py``: a clean exit, never a crash, then a resume.

One workdir per signal, a chain of runs of the same command: each run is sent the signal at
one moment (start-up and imports, building, compiling, the first step, mid-run, an eval, a
save, restoring a checkpoint), and the next run on that workdir is the rerun that must
resume from what it saved. Moments are events read from the run's output where there is
one (the header line before the first step compiles, "compiled and ran the first step", a
log line, an eval line right before a save), fixed offsets from the start before that.

Each case: exit 0 exactly when a new checkpoint was written (and stdout says which step),
else 130 (SIGINT) / 143 (SIGTERM) with "interrupted before the first step: nothing saved";
no traceback or segfault, at most two lines on stderr. A last run of the same command, not
signalled, resumes and finishes (train.steps=60) with exit 0. ``pytest -s`` prints the table
of all cases. The runs of a chain share a JAX compilation cache (only the first run to
reach a function compiles it). Then ``eval.py`` on the trained workdir, signalled at a few
offsets: exit 130 / 143, one line, no report written.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 60

OVERRIDES = {
    "model": {"d_model": 32, "num_layers": 1},
    "optim": {"warmup_steps": 5},
    "data": {"batch_size": 16, "eval_examples": 32},
    # the chain's runs stop by step 42 at the latest; the last one runs on to the end
    "train": {"steps": STEPS, "log_every": 5, "eval_every": 20, "checkpoint_every": 20},
}
# the orbax chatter of a save, fixed elsewhere; not an error line of ours
HEADER = re.compile(r"^experiment ")
HANG_S = 600  # only against hangs: every moment is an event or a short offset
# chains run at once (the two signals: independent workdirs)
PARALLEL = int(os.environ.get("TFMJAX_INTERRUPT_TEST_PARALLEL", "2"))


@dataclass
class Moment:
    """When to send the signal: ``after`` seconds past process start or past ``line``."""

    name: str
    after: float = 0.0
    line: re.Pattern | None = None
    compile_cache: bool = True  # False: compile for real (the moment is inside XLA)
    twice: bool = False  # a second SIGINT 0.3 s after the first: must exit at once


MOMENTS = [
    Moment("start+0.3s (imports)", after=0.3),
    Moment("start+1.5s (importing jax, building)", after=1.5),
    # the first run to reach the first step compiles it (the chain's cache is cold), and so
    # does the first resumed one (a restored state: another executable); later ones hit
    Moment("header+1s (compiling)", after=1.0, line=HEADER),
    Moment("header (tracing, compiling)", line=HEADER),
    Moment("first step done", line=re.compile(r"^compiled and ran the first step")),
    Moment("first log line (mid-run)", line=re.compile(r"^train step")),
    Moment("log at eval step (eval runs)", line=re.compile(r"^train step +\d*[02468]0 ")),
    Moment("eval line (save runs)", line=re.compile(r"^eval  step")),
    Moment("start+3s (resume: restoring)", after=3.0),
]
TWICE = Moment("2x Ctrl-C in compile", after=0.2, line=HEADER, compile_cache=False, twice=True)
# SIGTERM takes SIGINT's handler: its chain sends it at one moment of each kind (before the
# first step, while compiling, mid-run, at a save, while restoring), not at every one
SIGTERM_MOMENTS = [
    m
    for m in MOMENTS
    if m.name.startswith(("start+1.5s", "header+1s", "first log", "eval line", "start+3s"))
]


@dataclass
class Result:
    moment: str
    signal: str
    code: int | None = None
    err: list[str] = field(default_factory=list)
    out: str = ""
    saved_before: int | None = None
    saved_after: int | None = None
    resumed: str = "-"
    seconds: float = 0.0
    exit_after_signal: float = float("nan")
    problems: list[str] = field(default_factory=list)


def _toml(config: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(v)

    lines = []
    for section, table in config.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in table.items() if not isinstance(v, dict)]
        for sub, inner in ((k, v) for k, v in table.items() if isinstance(v, dict)):
            lines.append(f"[{section}.{sub}]")
            lines += [f"{k} = {value(v)}" for k, v in inner.items()]
    return "\n".join(lines) + "\n"


def _config(tmp_path: Path, workdir: Path) -> Path:
    """configs/reverse.toml (what `make train` runs), made tiny."""
    config = tomllib.loads((ROOT / "configs" / "reverse.toml").read_text())
    for section, values in OVERRIDES.items():
        config.setdefault(section, {}).update(values)
    config["train"]["workdir"] = str(workdir)
    path = tmp_path / f"{workdir.name}.toml"
    path.write_text(_toml(config))
    return path


def _latest(workdir: Path) -> int | None:
    steps = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
    return max(steps) if steps else None


def _env(cache: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # conftest's 8 host devices: not what `make train` runs
    if cache is not None:
        env.update(
            JAX_COMPILATION_CACHE_DIR=str(cache),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    return env


class _Proc:
    """train.py as a subprocess, its output lines collected (with arrival times) by threads."""

    def __init__(self, cmd: list[str], env: dict):
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[tuple[float, str]] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out, True)),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err, False)),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream, into, stamped):
        for line in stream:
            into.append((time.monotonic(), line.rstrip("\n")) if stamped else line.rstrip("\n"))

    def seen(self, pattern: re.Pattern) -> float | None:
        return next((t for t, line in list(self.out) if pattern.search(line)), None)

    def wait(self, timeout: float) -> int | None:
        """The exit code; None if it hung (then it is killed)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        for t in self._threads:
            t.join(timeout=10)
        return code

    def stdout(self) -> str:
        return "\n".join(line for _, line in self.out)


def _signal_at(proc: _Proc, moment: Moment, sig: signal.Signals, deadline: float) -> float | None:
    """Wait for the moment, then signal; the time it was sent (None: the run ended first)."""
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            return None
        base = proc.start if moment.line is None else proc.seen(moment.line)
        if base is not None and time.monotonic() >= base + moment.after:
            proc.proc.send_signal(sig)
            sent = time.monotonic()
            if moment.twice:  # still compiling: tracing alone takes over a second
                time.sleep(0.3)
                proc.proc.send_signal(sig)
                sent = time.monotonic()
            return sent
        time.sleep(0.01)
    raise TimeoutError(f"the moment never came in {HANG_S}s")


def _case(cmd, workdir, moment, sig, cache) -> Result:
    res = Result(moment.name, sig.name, saved_before=_latest(workdir))
    proc = _Proc(cmd, _env(cache if moment.compile_cache else None))
    try:
        sent = _signal_at(proc, moment, sig, deadline=proc.start + HANG_S)
    except TimeoutError as err:
        sent = None
        res.problems.append(str(err))
        proc.proc.kill()
    res.code = proc.wait(timeout=HANG_S)
    if res.code is None:
        res.problems.append(f"hung: killed {HANG_S}s after the signal")
    res.seconds = time.monotonic() - proc.start
    res.exit_after_signal = time.monotonic() - sent if sent else float("nan")
    res.out, res.err = proc.stdout(), proc.err
    res.saved_after = _latest(workdir)
    if sent is None and not res.problems:
        res.problems.append("the run ended before the moment came")
    _check(res, moment, sig)
    _check_files(res, workdir)
    return res


def _check_files(res: Result, workdir: Path) -> None:
    """Nothing half-written: no unfinished checkpoint, torn metrics line or temporary file."""
    ckpts = workdir / "checkpoints"
    left = [p.name for p in ckpts.iterdir() if not p.name.isdigit()] if ckpts.is_dir() else []
    left += [p.name for p in workdir.glob("*tmp*")] if workdir.is_dir() else []
    if left:
        res.problems.append(f"left behind: {left}")
    metrics = workdir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            json.loads(line)
        except json.JSONDecodeError:
            res.problems.append(f"torn metrics line {line[:40]!r}")


def _check(res: Result, moment: Moment, sig: signal.Signals) -> None:
    bad = res.problems
    err_text = "\n".join(res.err)
    for word in ("Traceback", "Segmentation", "Fatal Python error", "core dumped"):
        if word in err_text or word in res.out:
            bad.append(f"{word!r} in the output")
    lines = [line for line in res.err if line.strip()]
    if len(lines) > 2:
        bad.append(f"{len(lines)} lines on stderr")
    new = res.saved_after is not None and res.saved_after != res.saved_before
    if moment.twice:  # its line says truly what is saved
        kept = (
            "nothing was saved"
            if res.saved_before is None
            else f"the last saved checkpoint (step {res.saved_before}) is intact"
        )
        if res.code != 130 or f"second Ctrl-C: exiting now; {kept}" not in err_text:
            bad.append(f"a second Ctrl-C: exit {res.code}, expected 130 with '{kept}'")
        return  # how soon it exited: _check_at_once, against this chain's own compile time
    if res.code == 0:
        if not new:
            bad.append("exit 0 but no new checkpoint")
        elif f"{sig.name}: saved step {res.saved_after}; stopping" not in res.out:
            bad.append(f"exit 0 without the line '{sig.name}: saved step {res.saved_after}'")
    elif res.code == 128 + sig.value:
        if new:
            bad.append(f"exit {res.code} but a new checkpoint {res.saved_after}")
        if f"{sig.name}: interrupted before the first step: nothing saved" not in err_text:
            bad.append("no 'interrupted before the first step' line")
    else:
        bad.append(f"exit {res.code}")


def _resumed(res: Result, latest: int | None) -> str:
    """Did this run (the rerun of the one before) start where the one before left off?"""
    said = re.search(r"resumed from checkpoint step (\d+)", res.out)
    if not re.search(r"^experiment ", res.out, re.M):
        return "stopped before the header"
    if latest is None:
        return "fresh start: OK" if not said else f"resumed from {said[1]} but none existed"
    if said and int(said[1]) == latest:
        return f"step {latest}: OK"
    return f"expected step {latest}, said {said[1] if said else 'nothing'}"


def _chain(tmp_path: Path, sig: signal.Signals, moments: list[Moment]) -> list[Result]:
    workdir = tmp_path / f"run_{sig.name.lower()}"
    config = _config(tmp_path, workdir)
    cache = tmp_path / f"jax_cache_{sig.name}"  # a chain's own: its first compiles are real
    cmd = [sys.executable, str(ROOT / "train.py"), "--progress", "lines", str(config)]
    results: list[Result] = []
    for moment in moments:
        res = _case(cmd, workdir, moment, sig, cache)
        if results:  # this run is the rerun of the one before
            results[-1].resumed = _resumed(res, res.saved_before)
            if "OK" not in results[-1].resumed and "before the header" not in results[-1].resumed:
                results[-1].problems.append(f"rerun: {results[-1].resumed}")
        results.append(res)
    # the last rerun: the same command, no signal: must resume and finish
    latest = _latest(workdir)
    final = Result(f"rerun to the end (step {STEPS})", "-", saved_before=latest)
    begin = time.monotonic()
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        env=_env(cache),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    final.seconds = time.monotonic() - begin
    final.code, final.out, final.err = done.returncode, done.stdout, done.stderr.splitlines()
    final.saved_after = _latest(workdir)
    results[-1].resumed = _resumed(final, latest)
    if "OK" not in results[-1].resumed:
        results[-1].problems.append(f"rerun: {results[-1].resumed}")
    final.resumed = f"done: step {final.saved_after}"
    if final.code != 0 or final.saved_after != STEPS or f"done: step {STEPS}" not in final.out:
        final.problems.append(f"the last rerun: exit {final.code}, {done.stderr[-2000:]}")
    if "Traceback" in done.stderr:
        final.problems.append("Traceback in the last rerun")
    results.append(final)
    _check_at_once(results)
    return results


COMPILED = re.compile(r"^compiled and ran the first step in ([\d.]+)s", re.M)


def _check_at_once(results: list[Result]) -> None:
    """A second Ctrl-C during a real compile exits at once, not once the compile is done: it
    exits in under half the time that compile takes on this machine, measured by the chain's
    own uncached compile (the longest "compiled and ran the first step in Xs"). A relative
    bound, so a slow or loaded machine does not fail it."""
    twice = [r for r in results if r.moment == TWICE.name]
    if not twice:
        return
    compiles = [float(x) for r in results for x in COMPILED.findall(r.out)]
    for r in twice:
        if not compiles:
            r.problems.append("no run of the chain compiled: nothing to compare the exit with")
        elif not r.exit_after_signal < 0.5 * max(compiles):
            r.problems.append(
                f"a second Ctrl-C took {r.exit_after_signal:.1f}s to exit; the compile it "
                f"interrupts takes {max(compiles):.1f}s"
            )


def _line(r: Result) -> str:
    """What the user reads last: stdout's stop or done line on exit 0, else stderr's line."""
    last = re.findall(r"^(?:SIG\w+: saved step|done: step) .*$", r.out, re.M)
    err = [line for line in r.err if line.strip()]
    return (last[-1] if last and r.code == 0 else "") or (err[0] if err else "")


COLUMNS = "signal moment exit saved the_line err_lines next_run_resumed exit_after run_s"


def _table(results: list[Result]) -> str:
    rows = [tuple(name.replace("_", " ") for name in COLUMNS.split())]
    for r in results:
        rows.append(
            (
                r.signal,
                r.moment,
                str(r.code),
                "-" if r.saved_after == r.saved_before else str(r.saved_after),
                _line(r)[:100],
                str(sum(1 for line in r.err if line.strip())),
                r.resumed,
                "-" if math.isnan(r.exit_after_signal) else f"{r.exit_after_signal:.1f}s",
                f"{r.seconds:.1f}" + ("  <-- " + "; ".join(r.problems) if r.problems else ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


EVAL_MOMENTS = [(signal.SIGINT, 0.3), (signal.SIGINT, 3.0), (signal.SIGTERM, 1.5)]


def _eval_cases(workdir: Path) -> list[Result]:
    """eval.py on a trained workdir: a signal exits 130 / 143 with one line, no report."""
    results = []
    for sig, after in EVAL_MOMENTS:
        res = Result(f"eval.py, start+{after:g}s", sig.name)
        proc = _Proc([sys.executable, str(ROOT / "eval.py"), str(workdir)], _env(None))
        sent = _signal_at(proc, Moment("", after=after), sig, deadline=proc.start + HANG_S)
        res.code = proc.wait(timeout=HANG_S)
        res.seconds = time.monotonic() - proc.start
        res.exit_after_signal = time.monotonic() - sent if sent else float("nan")
        res.out, res.err = proc.stdout(), proc.err
        lines = [line for line in res.err if line.strip()]
        reports = sorted(p.name for p in (workdir / "eval").glob("*")) if sent else []
        if "Traceback" in "\n".join(res.err) or len(lines) > 1:
            res.problems.append(f"stderr: {lines[:3]}")
        if sent and (res.code != 128 + sig.value or reports):
            res.problems.append(f"exit {res.code}, reports {reports}")
        res.resumed = "no report: OK" if not reports else f"reports {reports}"
        results.append(res)
    return results


@pytest.mark.slow
def test_signals_at_any_moment_exit_cleanly_and_resume(tmp_path):
    chains = {signal.SIGINT: MOMENTS + [TWICE], signal.SIGTERM: SIGTERM_MOMENTS}
    begin = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:  # a workdir per signal: independent
        futures = [pool.submit(_chain, tmp_path, sig, moments) for sig, moments in chains.items()]
        results = [r for future in futures for r in future.result()]
    results += _eval_cases(tmp_path / "run_sigint")
    print("\n" + _table(results))
    print(f"{len(results)} runs in {time.monotonic() - begin:.0f}s")
    problems = [f"{r.signal} at {r.moment}: {'; '.join(r.problems)}" for r in results if r.problems]
    assert not problems, "\n".join(problems)
