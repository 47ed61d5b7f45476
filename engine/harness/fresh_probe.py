"""When a candidate's slowness on inputs no call has read is its own: the fresh-input probe's rule.

The judge times a candidate on refreshed inputs after its rounds (engine.harness.benchmarking._fresh_probe): a
kernel that reused earlier calls' work on the rounds' reused input slots is slower there by what it skipped.
But a shared machine slows an honest kernel too. A burst of work from elsewhere (another test worker's
compile, a database checkpoint) lasting a fraction of a second once covered all five of an honest seed's probes,
taken back to back; the reference, probed once after them, was back at its pace, and the seed was recorded
``impossible`` -- the machine's doing called the kernel's.

So each probe of the candidate is paired with one of the reference right after it, and the candidate is found
reusing work only when, in every pair, it was more than FRESH_FACTOR slower than its rounds *and* more than
FRESH_FACTOR times as slowed as the reference. The pairs are spread out (waits that double between them), so one
burst cannot cover them all. An honest kernel usually clears the first probe, and then nothing more runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "FRESH_FACTOR",
    "FRESH_PAUSE_S",
    "FRESH_PROBES",
    "ProbePair",
    "microseconds",
    "probes_spread_s",
    "reuse_seen",
]

# This many probes at most; the candidate must be this many times slower than its rounds' median in each (and
# this many times as slowed as the reference) to be found reusing work.
FRESH_PROBES = 5
FRESH_FACTOR = 2.0
# The wait before the second probe, doubled before each later one (0.1 + 0.2 + 0.4 + 0.8 s): only a candidate
# slow on every probe so far waits at all.
FRESH_PAUSE_S = 0.1


class ProbePair(NamedTuple):
    """One probe: how many times slower than in their rounds the candidate and the reference ran on fresh inputs."""

    candidate: float
    reference: float | None  # None where there is no reference to compare with


def _pause_before_s(probe: int) -> float:
    """The wait before probe ``probe`` (from 1): FRESH_PAUSE_S, doubled before each later one."""
    return FRESH_PAUSE_S * 2 ** (probe - 1)


def probes_spread_s(probes: int) -> float:
    """Seconds of waiting between the first of ``probes`` probes and the last."""
    return sum(_pause_before_s(probe) for probe in range(1, probes))


def reuse_seen(
    candidate: Callable[[], float],
    reference: Callable[[], float] | None,
    pause: Callable[[float], None] = time.sleep,
) -> list[ProbePair] | None:
    """The probes, when every one found the candidate slow on fresh inputs past what the machine explains; None as
    soon as one did not.

    ``candidate`` and ``reference`` each time one probe batch and return its per-call time over the contender's
    rounds' median (1.0: its usual pace). Without a reference, the candidate's slowness alone decides."""
    pairs: list[ProbePair] = []
    for probe in range(FRESH_PROBES):
        if probe:
            pause(_pause_before_s(probe))
        slowdown = candidate()
        if slowdown <= FRESH_FACTOR:
            return None
        control = reference() if reference is not None else None
        # A reference slowed as well says the machine was slow: the candidate must be FRESH_FACTOR beyond it.
        if control is not None and slowdown <= FRESH_FACTOR * max(control, 1.0):
            return None
        pairs.append(ProbePair(slowdown, control))
    return pairs


def microseconds(ns: float) -> str:
    """Nanoseconds as a finding's message shows them: microseconds, three figures, whole ones from a hundred up
    (``6,107 us``, not ``6.11e+03 us``)."""
    us = ns / 1e3
    return f"{us:,.0f} us" if us >= 100 else f"{us:.3g} us"
