"""StopAgreement: with several processes the stop flag is gathered at agreed steps only,
every few steps, so the gather stays under its budget of the time; every process acts on a
signal at the same step."""

from __future__ import annotations

import tfmjax.train.stopping as stopping
from tfmjax.train.stopping import StopAgreement, StopSignals


class FakeClock:
    """Seconds that move only when told: ``step_s`` per train step, ``gather_s`` per gather."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_steps(monkeypatch, steps: int, step_s: float, gather_s: float, signal_at=None):
    """The loop's calls (``check(start)``, then ``check(done)`` after each step) on a fake
    clock; returns the steps that gathered, what they gathered and when a stop came."""
    clock, gathered = FakeClock(), []

    def fake_any_process(*values):
        gathered.append(values)
        clock.now += gather_s
        return values  # this process's values are the max (the peer is idle)

    monkeypatch.setattr(stopping, "any_process", fake_any_process)
    stop = StopSignals()
    agreement = StopAgreement(stop, processes=2, clock=clock)
    at = []
    assert agreement.check(0) is None
    for done in range(1, steps + 1):
        clock.now += step_s
        if done == signal_at:
            stop.requested = "SIGTERM"
        before = len(gathered)
        if agreement.check(done):
            return done, gathered, at + [done]
        if len(gathered) > before:
            at.append(done)
    return None, gathered, at


def test_the_interval_keeps_the_gather_under_one_percent(monkeypatch):
    """2.9 ms gathers against 25 ms steps: each gather proposes ceil(2.9 / 0.25) = 12 steps,
    so after the first two (no cost known, then the first step) gathers come every 12 steps."""
    stopped, gathered, at = run_steps(monkeypatch, 100, step_s=0.025, gather_s=0.0029)
    assert stopped is None
    assert at[:2] == [1, 13] and all(b - a == 12 for a, b in zip(at[1:], at[2:], strict=False))
    assert [interval for _, interval in gathered[2:]] == [12] * (len(gathered) - 2)
    spent = len(gathered) * 0.0029 / (100 * 0.025)
    assert spent < 0.013  # the first two gathers come before the interval is known


def test_long_steps_agree_every_step(monkeypatch):
    stopped, gathered, at = run_steps(monkeypatch, 20, step_s=2.0, gather_s=0.003)
    assert at == list(range(1, 21))


def test_a_signal_stops_at_the_next_agreed_step_and_says_which(monkeypatch):
    stopped, gathered, _ = run_steps(monkeypatch, 100, 0.025, 0.0029, signal_at=20)
    assert stopped == 25  # agreed steps 1, 13, 25, ...
    assert gathered[-1][0] == 15  # SIGTERM's number went into the gather


def test_one_process_reads_its_own_flag_every_step_without_gathering(monkeypatch):
    monkeypatch.setattr(stopping, "any_process", lambda *v: (_ for _ in ()).throw(AssertionError))
    stop = StopSignals()
    agreement = StopAgreement(stop, processes=1)
    assert agreement.check(1) is None
    stop.requested = "SIGINT"
    assert agreement.check(2) == "SIGINT"
