"""Whether a worker that missed a deadline was held back by the machine rather than by its kernel.

A deadline on a reply (a call, a batch, Finish) is measured on the wall clock, but it is the kernel's verdict
only when the kernel caused the wait: it ran too long, spun, or blocked. On an overloaded machine a worker can
also miss it while it was ready to run and no CPU ran it. The kernel did not cause that, so it must not become
the kernel's ``timeout`` (DESIGN.md: an outcome is the kernel's only when the kernel caused it).

When a command is sent the parent reads the worker's CPU time from outside (its process CPU clock, one system
call, so it costs every command a microsecond or two). At a missed deadline it reads the clock again, and whether
any of the worker's threads is runnable now (``/proc/PID/task/TID/stat``: read only then, as it costs a hundred
times more). A worker that had a good share of the deadline on a CPU, or that is blocked (asleep, stopped),
missed it by itself. A worker that is runnable yet had little CPU time was kept waiting for a CPU: the parent
gives it more time (:data:`STARVED_PATIENCE` more deadlines of the same length) and, if the machine never lets
it run, reports the machine, never the kernel.

One look at the deadline is not enough: a kernel that sleeps and spins only around each deadline it can work
out (the call's timeout is no secret) looks runnable there with little CPU time -- "held by the machine", so it
would be retried forever and never judged. So the parent also looks in the second half of each wait, at random
moments it does not announce (:data:`SAMPLE_INTERVAL_S`), and blames the machine only when the worker was ready to
run in at least :data:`RUNNABLE_SHARE` of those looks too: a worker kept off its CPU is ready to run the whole
time, a sleeper is not.

Why not the scheduler's run-queue delay: Linux adds a wait to it only when the waiting thread finally gets a
CPU, so a worker still kept off its CPU at the deadline shows none of it (and where schedstats are off, as on
this project's CI machines, it reads 0 throughout).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A worker that had at least this fraction of the deadline on a CPU had its chance: the miss is its own.
HAD_ITS_CPU = 0.5
# How many more deadlines of the same length a worker kept off its CPU is given before the machine is blamed.
STARVED_PATIENCE = 4
# Looks at the worker in the second half of a wait for a reply: every SAMPLE_INTERVAL_S seconds, at random (at
# least MIN_SAMPLES in each deadline), and the share of them in which it must have been ready to run.
SAMPLE_INTERVAL_S = (0.05, 0.15)
MIN_SAMPLES = 8
RUNNABLE_SHARE = 0.8


@dataclass(frozen=True)
class CpuTime:
    """How long a process had run on a CPU, read from outside at one moment."""

    ran_ns: int
    """Nanoseconds its threads have run on a CPU since it started, the ended ones included."""
    at_ns: int
    """The reader's monotonic clock when the reading was taken."""


@dataclass(frozen=True)
class Schedule:
    """A reading taken at a missed deadline: the CPU time, and whether the process waits for a CPU now."""

    cpu: CpuTime
    runnable: bool
    """Some thread is running or ready to run (state R), not asleep, stopped or gone."""


def _libc_clock_getcpuclockid() -> Callable[[int, Any], int] | None:
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).clock_getcpuclockid
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    function.restype = ctypes.c_int
    return function


# Python has no clock_getcpuclockid(3); the C library's is called once per worker, and each reading after that is
# one clock_gettime.
_CLOCK_GETCPUCLOCKID = _libc_clock_getcpuclockid()


class Watch:
    """Readings of one process's scheduling, from outside it (the candidate cannot write what they read)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.clock: int | None = None
        if _CLOCK_GETCPUCLOCKID is not None:
            clock = ctypes.c_int()
            if _CLOCK_GETCPUCLOCKID(pid, ctypes.byref(clock)) == 0:
                self.clock = clock.value

    def cpu_time(self) -> CpuTime | None:
        """The process's CPU time now, or None where it cannot be read (the process is gone, or this system has
        no process CPU clocks): then no missed deadline is blamed on the machine."""
        if self.clock is None:
            return None
        at = time.monotonic_ns()
        try:
            return CpuTime(ran_ns=time.clock_gettime_ns(self.clock), at_ns=at)
        except OSError:
            return None

    def schedule(self) -> Schedule | None:
        """The CPU time and whether a thread waits for a CPU now; None where the CPU time cannot be read."""
        cpu = self.cpu_time()
        if cpu is None:
            return None
        runnable = self.runnable()
        if runnable is None:
            return None
        return Schedule(cpu=cpu, runnable=runnable)

    def runnable(self) -> bool | None:
        """Whether some thread of the process is running or ready to run now (state R); None when it is gone."""
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return None
        runnable = False
        for tid in tasks:
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat", "rb") as file:
                    # "tid (comm) S ...": the name may hold spaces and parentheses, the state follows the last ')'.
                    runnable |= file.read().rpartition(b")")[2].split()[0] == b"R"
            except (OSError, IndexError):
                continue  # a thread that ended between the listing and the read
        return runnable


@dataclass(frozen=True)
class Wait:
    """What the worker did between sending a command and a missed deadline."""

    wall_ns: int
    ran_ns: int
    runnable: bool
    runnable_share: float = 1.0
    """Of the looks taken while the reply was awaited, the share in which the worker was ready to run."""

    def held_by_machine(self, deadline_s: float) -> bool:
        """Ready to run at the deadline and in at least :data:`RUNNABLE_SHARE` of the looks before it, yet it had
        less than :data:`HAD_ITS_CPU` of the deadline on a CPU."""
        return self.runnable and self.runnable_share >= RUNNABLE_SHARE and self.ran_ns < HAD_ITS_CPU * deadline_s * 1e9

    def describe(self) -> str:
        return (
            f"in {self.wall_ns / 1e9:.1f}s the worker ran {self.ran_ns / 1e9:.2f}s on a CPU and "
            f"{'was still waiting for one' if self.runnable else 'was not waiting for one'} "
            f"(ready to run in {self.runnable_share:.0%} of the looks while it was awaited)"
        )


def since(sent: CpuTime | None, now: Schedule | None, looks: list[bool] | None = None) -> Wait | None:
    """The wait between a reading at send and one at the deadline, with the looks taken in between (whether the
    worker was ready to run in each); None when a reading is missing."""
    if sent is None or now is None:
        return None
    share = sum(looks) / len(looks) if looks else 1.0
    return Wait(
        wall_ns=now.cpu.at_ns - sent.at_ns,
        ran_ns=now.cpu.ran_ns - sent.ran_ns,
        runnable=now.runnable,
        runnable_share=share,
    )
