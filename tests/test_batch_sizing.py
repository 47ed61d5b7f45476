"""Batch sizing on a loaded machine: a handshake that reads as long as a call must not size a batch that runs
past its timeout.

The contenders here are simulated (their clocks are arithmetic): what is under test is how the shape timer
turns a handshake and single-call readings into batch sizes and timeouts, which a real sandboxed worker
cannot be made to misreport on demand. Real workers time real kernels in test_evaluation.py and
test_judge_integrity.py.
"""

from __future__ import annotations

import random
from typing import Any, cast

import pytest

from engine.harness.benchmarking import MAX_BATCH_CALLS, _ShapeTimer
from engine.harness.driver import Contender


class TimedOut(Exception):
    """A batch ran past the timeout the timer gave it."""


class SimulatedContender:
    """A worker whose empty batches (pings) take ``ping_ns``, whose single-call batches read ``single_ns`` (a
    ping that got the core sooner can read shorter than the pings), and whose longer batches take the per-call
    time for real."""

    def __init__(self, *, ping_ns: float, single_ns: float, per_call_ns: float) -> None:
        self.ping_ns = ping_ns
        self.single_ns = single_ns
        self.per_call_ns = per_call_ns
        self.batches: list[tuple[int, float]] = []

    def timed_batch(self, calls: int, timeout: float, keep: int = -1) -> int:
        # Every batch that makes calls keeps one of them, anywhere in it; an empty one keeps none.
        assert keep == -1 if calls == 0 else 0 <= keep < calls, (calls, keep)
        if calls == 0:
            elapsed = self.ping_ns
        elif calls == 1:
            elapsed = self.single_ns
        else:
            elapsed = 0.1 * self.ping_ns + calls * self.per_call_ns
        self.batches.append((calls, elapsed))
        if elapsed > timeout * 1e9:
            raise TimedOut(f"a batch of {calls} call(s) took {elapsed / 1e9:.1f} s, its timeout was {timeout:.1f} s")
        return int(elapsed)

    def pause(self) -> None:
        pass


def sized(*contenders: SimulatedContender, budget_s: float = 0.01) -> _ShapeTimer:
    timer = _ShapeTimer(
        cast(list[Contender], list(contenders)), int(budget_s * 1e9), call_timeout_s=1.0, rng=random.Random(0)
    )
    timer.handshake()
    timer.warm_up()
    return timer


def batch_s(contender: SimulatedContender, calls: int) -> float:
    return calls * contender.per_call_ns / 1e9


def test_a_handshake_as_long_as_a_call_does_not_size_a_batch_past_its_timeout() -> None:
    # 150 us a call; the pings read 1 ms (the worker waited for a core), a single call 0.9 ms: read naively,
    # the call costs nothing and the batch would be MAX_BATCH_CALLS long, about 10 s.
    slow = SimulatedContender(ping_ns=1e6, single_ns=0.9e6, per_call_ns=150e3)
    timer = sized(slow, SimulatedContender(ping_ns=1e6, single_ns=0.9e6, per_call_ns=150e3))
    assert timer.calls[0] < MAX_BATCH_CALLS
    assert timer.per_call_ns[0] == pytest.approx(150e3, rel=0.05)
    # The batches are about HANDSHAKE_MULTIPLE handshakes long: 200 ms here, not 10 s.
    assert 0.1 <= batch_s(slow, timer.calls[0]) <= 0.4
    rounds: Any = timer.rounds(lambda _round: None)
    assert rounds.shape[0] >= 10
    assert all(calls * slow.per_call_ns < 1e9 for calls, _ in slow.batches)


def test_a_kernel_far_below_the_handshake_keeps_an_estimate_the_check_does_not_refute() -> None:
    # 20 ns a call, 20 us a ping, a single call read 0.5 us over the ping: the check reads 20 ns, shorter than
    # the estimate, so the batches stay as the estimate sizes them (they cannot run too long).
    tiny = SimulatedContender(ping_ns=20e3, single_ns=20.5e3, per_call_ns=20.0)
    timer = sized(tiny, SimulatedContender(ping_ns=20e3, single_ns=20.5e3, per_call_ns=20.0))
    assert timer.per_call_ns == [pytest.approx(500.0), pytest.approx(500.0)]
    assert any(calls > 1 for calls, _ in tiny.batches), "the estimate below the handshake was not checked"


def test_a_tiny_kernel_read_as_free_gets_its_checked_time() -> None:
    # The single call read shorter than the pings: 1 ns. The check reads about 20 ns; either way the batch is
    # as long as MAX_BATCH_CALLS allows.
    tiny = SimulatedContender(ping_ns=20e3, single_ns=19e3, per_call_ns=20.0)
    timer = sized(tiny, SimulatedContender(ping_ns=20e3, single_ns=19e3, per_call_ns=20.0))
    assert 15.0 < timer.per_call_ns[0] < 25.0
    assert timer.calls == [MAX_BATCH_CALLS, MAX_BATCH_CALLS]


def test_a_call_longer_than_the_handshake_is_not_checked() -> None:
    # 100 us a call, 20 us a ping: the single-call reading is trusted, no ramp batch runs.
    steady = SimulatedContender(ping_ns=20e3, single_ns=120e3, per_call_ns=100e3)
    timer = sized(steady, SimulatedContender(ping_ns=20e3, single_ns=120e3, per_call_ns=100e3))
    assert {calls for calls, _ in steady.batches} == {0, 1}
    assert timer.per_call_ns[0] == pytest.approx(100e3, rel=0.05)
