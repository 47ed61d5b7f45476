"""The fresh-input probe's rule (engine.harness.fresh_probe) against a machine whose load comes and goes.

CI once recorded the softmax seed ``impossible``: a burst of load from the other test worker covered all five of
its probes, taken back to back, and the reference probed once after them was back at its pace. Here the machine
is a clock: each probe batch takes its pace times the load at the time it starts, and a pause moves the clock on.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.harness.fresh_probe import FRESH_FACTOR, FRESH_PAUSE_S, FRESH_PROBES, microseconds, reuse_seen

BATCH_S = 0.01  # a probe batch lasts FRESH_BATCH_NS at the contender's usual pace


class Machine:
    """A fake clock with load: ``busy(t)`` is how many times slower everything runs at time t."""

    def __init__(self, busy: Callable[[float], float]) -> None:
        self.now = 0.0
        self.busy = busy
        self.pauses: list[float] = []

    def contender(self, fresh_pace: float) -> Callable[[], float]:
        """A contender ``fresh_pace`` times slower on fresh inputs than in its rounds (1: an honest kernel)."""

        def probe() -> float:
            slowdown = fresh_pace * self.busy(self.now)
            self.now += BATCH_S * slowdown
            return slowdown

        return probe

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def burst(until_s: float, factor: float = 3.0) -> Callable[[float], float]:
    return lambda t: factor if t < until_s else 1.0


@pytest.mark.parametrize("burst_s", [0.06, 0.12, 0.14, 0.5, 1.0])
def test_an_honest_kernel_is_not_found_reusing_work_in_a_burst_of_load(burst_s: float) -> None:
    """A burst that slows the candidate's probes slows the reference probed right after each as well; a burst
    shorter than the probes' spread lets a later probe through, with or without a reference. (0.14 s ends
    between a fifth candidate probe taken back to back and the reference's: the CI failure's timing.)"""
    for with_reference in (True, False):
        machine = Machine(burst(burst_s))
        reference = machine.contender(1.0) if with_reference else None
        assert reuse_seen(machine.contender(1.0), reference, machine.pause) is None, (burst_s, with_reference)


def test_the_probes_are_spread_over_more_time_than_a_burst_lasts() -> None:
    """Five probes back to back (50 ms) fit inside one burst; spread, the last starts 1.5 s after the first."""
    machine = Machine(burst(1.4))
    assert reuse_seen(machine.contender(1.0), None, machine.pause) is None
    assert machine.pauses == [FRESH_PAUSE_S * 2**i for i in range(FRESH_PROBES - 1)]


@pytest.mark.parametrize("busy", [burst(0.3), burst(10.0, 1.5), lambda t: 1.0], ids=["burst", "slow", "idle"])
def test_a_kernel_that_reused_work_is_found_whatever_the_load(busy: Callable[[float], float]) -> None:
    """A kernel 3x slower on fresh inputs (what it skipped in the rounds) stays 3x beyond the reference in every
    pair, idle or busy; each pair is kept as evidence."""
    machine = Machine(busy)
    pairs = reuse_seen(machine.contender(3.0), machine.contender(1.0), machine.pause)
    assert pairs is not None and len(pairs) == FRESH_PROBES
    assert all(pair.candidate > FRESH_FACTOR * max(pair.reference or 1.0, 1.0) for pair in pairs), pairs


def test_a_machine_slow_for_the_whole_probe_clears_an_honest_kernel_only_through_the_reference() -> None:
    """Three times slower throughout: without a reference the honest kernel is indistinguishable from one that
    reused work (found), with one it is cleared at the first pair and nothing more runs."""
    machine = Machine(lambda t: 3.0)
    assert reuse_seen(machine.contender(1.0), None, machine.pause) is not None
    machine = Machine(lambda t: 3.0)
    assert reuse_seen(machine.contender(1.0), machine.contender(1.0), machine.pause) is None
    assert machine.pauses == []


def test_a_findings_times_read_as_microseconds_in_whole_figures_from_a_hundred() -> None:
    assert [microseconds(ns) for ns in (975.0, 12_345.0, 99_949.0, 6_107_400.0)] == [
        "0.975 us",
        "12.3 us",
        "99.9 us",
        "6,107 us",
    ]
