"""Whether a worker that missed a deadline was held back by the machine rather than by its kernel.

A deadline on a reply (a call, a batch, Finish) is measured on the wall clock, but it is the kernel's verdict
only when the kernel caused the wait: it ran too long, spun, or blocked. On an overloaded machine a worker can
also miss it while it was ready to run and no CPU ran it. The kernel did not cause that, so it must not become
the kernel's ``timeout`` (DESIGN.md: an outcome is the kernel's only when the kernel caused it).

At a missed deadline the parent reads, from outside, how much CPU time the worker's threads had since the
command was sent (``/proc/PID/task/TID/schedstat``, the scheduler's own count) and whether any of them is
runnable now. A worker that had a good share of the deadline on a CPU, or that is blocked (asleep, stopped),
missed it by itself. A worker that is runnable yet had little CPU time was kept waiting for a CPU: the parent
gives it more time (:data:`STARVED_PATIENCE` more deadlines of the same length) and, if the machine never lets
it run, reports the machine, never the kernel.

Why not the scheduler's run-queue delay: Linux adds a wait to it only when the waiting thread finally gets a
CPU, so a worker still kept off its CPU at the deadline shows none of it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# A worker that had at least this fraction of the deadline on a CPU had its chance: the miss is its own.
HAD_ITS_CPU = 0.5
# How many more deadlines of the same length a worker kept off its CPU is given before the machine is blamed.
STARVED_PATIENCE = 4


@dataclass(frozen=True)
class Schedule:
    """One reading of a process's threads, taken from outside."""

    ran_ns: int
    """Nanoseconds its threads have run on a CPU, summed over the threads alive now."""
    runnable: bool
    """Some thread is running or ready to run (state R), not asleep, stopped or gone."""
    at_ns: int
    """The reader's monotonic clock when the reading was taken."""


def read(pid: int) -> Schedule | None:
    """The scheduler's reading of every thread of ``pid``, or None where it cannot be read (the process is
    gone, or this kernel keeps no such count): then no missed deadline is blamed on the machine."""
    ran = 0
    runnable = False
    at = time.monotonic_ns()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as file:
                ran += int(file.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as file:
                # "tid (comm) S ...": the name may hold spaces and parentheses, the state follows the last ')'.
                runnable |= file.read().rpartition(b")")[2].split()[0] == b"R"
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return Schedule(ran_ns=ran, runnable=runnable, at_ns=at)


@dataclass(frozen=True)
class Wait:
    """What the worker did between sending a command and a missed deadline."""

    wall_ns: int
    ran_ns: int
    runnable: bool

    def held_by_machine(self, deadline_s: float) -> bool:
        """Ready to run at the deadline, yet it had less than :data:`HAD_ITS_CPU` of the deadline on a CPU."""
        return self.runnable and self.ran_ns < HAD_ITS_CPU * deadline_s * 1e9

    def describe(self) -> str:
        return (
            f"in {self.wall_ns / 1e9:.1f}s the worker ran {self.ran_ns / 1e9:.2f}s on a CPU and "
            f"{'was still waiting for one' if self.runnable else 'was not waiting for one'}"
        )


def since(sent: Schedule | None, now: Schedule | None) -> Wait | None:
    """The wait between two readings of one process; None when either is missing."""
    if sent is None or now is None:
        return None
    # A thread that ended between the readings takes its count with it: never count below zero.
    return Wait(wall_ns=now.at_ns - sent.at_ns, ran_ns=max(0, now.ran_ns - sent.ran_ns), runnable=now.runnable)
