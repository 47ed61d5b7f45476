"""Whether work from outside a benchmark ran on its cores while it timed: a reading taken on a busy machine.

A benchmark leases its cores among this project's sandboxes (engine/harness/sandbox.py CpuLease), and a lease it
had to share says so. Nothing kept other processes off those cores: another user's job, a compiler, a neighbour's
test run. Interleaved rounds share such a preemption between the contenders only on average, so a reading timed
beside one is wider and can be off, and it is the kind of reading that must be re-measured before it steers a
search or promotes (issue 12 item 4), or be timed again before it enters a recorded landscape.

How: the kernel counts, per CPU, the time it spent running anything (``/proc/stat`` through psutil: user, nice,
system, interrupts and the hypervisor's steal, in clock ticks). Around each shape's timed part the benchmark reads
those counters for its leased CPUs, and the CPU time of its own contenders' workers (their process CPU clocks, in
nanoseconds, engine/harness/starvation.py) and of this process (which may run on a leased CPU while it waits for a
reply or checks an output). What the leased CPUs ran beyond that was someone else's: its share of the leased
CPUs' wall time is the reading's ``foreign_cpu_share``. Steal counts as foreign: the hypervisor gave the CPU to
another guest.

Limits: the counters move in ticks (10 ms where USER_HZ is 100), so each window's two readings per CPU are allowed
two ticks of error, which is taken off the foreign time (a short benchmark therefore flags only heavy
contention); this process's whole CPU time is subtracted, though some of it may have run on other CPUs, so the
share errs low, never high; and what another core does to the shared cache and memory bus is not seen here.
Where a count cannot be read (no ``/proc/stat``, a CPU it does not list, a worker whose CPU clock is unreadable),
the share is None: unknown, not quiet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

FOREIGN_SHARE_BUSY = 0.1
"""A reading whose leased CPUs spent more than this share of their time on foreign work was taken on a busy
machine. A runnable neighbour on a leased core takes about half of it (the scheduler shares the core); a few
percent is what daemons and interrupts take on a quiet machine."""

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
"""One clock tick, the unit of the per-CPU counters."""


def busy_seconds(cpus: Sequence[int]) -> list[float] | None:
    """Seconds each of ``cpus`` has run anything since boot; None where the counters do not cover them."""
    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (OSError, psutil.Error):
        return None
    # psutil lists the CPUs /proc/stat lists, in order: with a CPU offline the list index is not the CPU's number.
    if len(per_cpu) != os.cpu_count() or any(not 0 <= cpu < len(per_cpu) for cpu in cpus):
        return None
    return [
        t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)
        for t in (per_cpu[cpu] for cpu in cpus)
    ]


@dataclass(frozen=True)
class _Snapshot:
    wall_s: float
    busy_s: list[float]
    own_ns: int


class CoreWatch:
    """Foreign work on a benchmark's leased CPUs, summed over the windows it timed in (see the module's doc).

    ``own_cpu_ns`` reads the CPU time of everything the benchmark runs on those CPUs (its contenders' workers), in
    nanoseconds, or None where one cannot be read; this process's CPU time is added to it."""

    def __init__(
        self,
        cpus: Sequence[int],
        own_cpu_ns: Callable[[], int | None],
        *,
        counters: Callable[[Sequence[int]], list[float] | None] = busy_seconds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``counters`` and ``clock``: the per-CPU busy seconds and the wall clock (the kernel's and
        time.monotonic; a test gives its own)."""
        self.cpus = list(cpus)
        self.own_cpu_ns = own_cpu_ns
        self.counters = counters
        self.clock = clock
        self.wall_s = 0.0
        self.foreign_s = 0.0
        self.windows = 0
        self.known = bool(self.cpus)
        self._started: _Snapshot | None = None

    def _snapshot(self) -> _Snapshot | None:
        own = self.own_cpu_ns()
        busy = self.counters(self.cpus)
        if own is None or busy is None:
            return None
        return _Snapshot(self.clock(), busy, own + time.process_time_ns())

    def start(self) -> None:
        """Open a window (a shape's timed part)."""
        self._started = self._snapshot() if self.known else None
        self.known = self._started is not None

    def stop(self) -> None:
        """Close the window opened by :meth:`start` and add what it saw."""
        started, self._started = self._started, None
        if started is None:
            return
        ended = self._snapshot()
        if ended is None:
            self.known = False
            return
        busy = sum(b - a for a, b in zip(started.busy_s, ended.busy_s, strict=True))
        own = (ended.own_ns - started.own_ns) / 1e9
        allowance = 2 * TICK_S * len(self.cpus)
        self.foreign_s += max(0.0, busy - own - allowance)
        self.wall_s += ended.wall_s - started.wall_s
        self.windows += 1

    def share(self) -> float | None:
        """Foreign CPU time over the leased CPUs' wall time in the windows so far; None where unknown or none."""
        if not self.known or self.windows == 0 or self.wall_s <= 0:
            return None
        return min(1.0, self.foreign_s / (self.wall_s * len(self.cpus)))


def busy(foreign_cpu_share: float | None) -> bool:
    """Whether a reading with this foreign share was taken on a busy machine (None, unknown: not called busy)."""
    return foreign_cpu_share is not None and foreign_cpu_share > FOREIGN_SHARE_BUSY


def busy_reason(cpus_exclusive: bool, foreign_cpu_share: float | None) -> str:
    """What shared a benchmark's cores, for a reader of its evidence ("" when nothing did)."""
    parts = []
    if not cpus_exclusive:
        parts.append("another benchmark of this machine's held the same cores")
    if busy(foreign_cpu_share):
        parts.append(f"{foreign_cpu_share:.0%} of the cores' time went to other work while it timed")
    return " and ".join(parts)
