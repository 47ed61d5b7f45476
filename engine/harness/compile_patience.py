"""When a compile that reached its wall-clock limit is stopped, and whose fault the stop is.

What a source can make a compiler do (expand macros, instantiate templates, optimise) is CPU work: every include of
anything but system headers, and ``.incbin``, is refused before the compiler runs, so a source cannot make it wait
on a file or a pipe. A compile's budget is therefore CPU time, and the wall-clock limit is there to notice one that
is not running: on an idle machine the two agree (a compiler that works the whole time reaches both together).

On a loaded machine they do not. A compiler given a third of a CPU reaches its wall-clock limit with a third of its
work done. Stopping it there would be the machine's failure, not the source's (DESIGN.md: an outcome is the kernel's
only when the kernel caused it), and compiling it again on the same loaded machine ends the same way: a
preprocessor bomb was retried up to the step's attempts, two minutes each, before the candidate ended as a harness
error nobody learned from, and an honest source that needed a minute of CPU never compiled at all.

So a compile that reaches its limit (:attr:`CompilePatience.limit_s`) without having run :data:`HAD_ITS_CPU` of it
on a CPU is given more time while it keeps running: it stops as the source's ``timeout`` once it has had that much
CPU time, and as ``held`` (the machine's) when it gains none for :data:`STALL_S` (a paused machine, a compiler kept
off every CPU, a stalled disk) or when the wall clock reaches :data:`STRETCH` times the limit (a machine too loaded
to judge anything). A compile whose CPU time cannot be read is the source's ``timeout`` at the limit, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

HAD_ITS_CPU = 0.5
"""Share of its limit a compile must have run on a CPU for a stop to be the source's fault."""

STRETCH = 4.0
"""Most a held-back compile's wall-clock limit stretches, as a multiple of the limit: past it the machine is too
loaded to judge (a compile given less than HAD_ITS_CPU / STRETCH of a CPU, an eighth)."""

STALL_S = 10.0
"""Seconds without any CPU time after which a compile past its limit is held (at most a quarter of the limit, see
CompilePatience.stall_s):
a paused or stalled compiler gains none, a slowed one gains some every second."""

CHECK_S = 0.5
"""Seconds between readings of a compile's CPU time once it is past its limit."""

STALL_READINGS = 3
"""Fewest readings (CHECK_S apart) without CPU time that make a compile held, whatever its limit: with a short limit
(a quarter of 2 s is one reading) a compile slowed to a tenth of a CPU on a busy machine could gain not one clock
tick between two readings and be held while it was running (CI, tests/test_toolchain.py)."""

PROGRESS_S = 0.01
"""CPU seconds gained since the last reading that count as running."""

Stop = Literal["timeout", "held"]


@dataclass
class CompilePatience:
    """The stopping rule of one compile (see the module docstring), fed the compile's elapsed wall time and a
    reader of its CPU time."""

    limit_s: float
    """The compile's wall-clock limit on an idle machine."""
    had_its_cpu: float = HAD_ITS_CPU
    """Share of the limit on a CPU that makes a stop the source's (each compiler's own setting)."""
    cpu_s: float | None = None
    """The compile's CPU seconds at the last reading past the limit (None before, or where it cannot be read)."""
    stop: Stop | None = None
    """Why the compile must stop, once it must."""
    _progress_at: float = field(default=0.0, repr=False)
    _checked_at: float = field(default=-1.0, repr=False)

    @property
    def longest_s(self) -> float:
        """The wall-clock limit of a compile the machine holds back: no compile runs longer."""
        return STRETCH * self.limit_s

    @property
    def stall_s(self) -> float:
        """Seconds without CPU time after which a compile past its limit is held: a quarter of the limit, at most
        STALL_S and at least STALL_READINGS readings."""
        return min(STALL_S, max(self.limit_s / 4, STALL_READINGS * CHECK_S))

    def decide(self, elapsed_s: float, read_cpu: Callable[[], float | None]) -> Stop | None:
        """Whether the compile must stop now, ``elapsed_s`` into it; ``read_cpu`` gives the CPU seconds it has run
        (read only past the limit, at most every CHECK_S)."""
        if self.stop is not None or elapsed_s < self.limit_s:
            return self.stop
        if self._checked_at >= 0 and elapsed_s - self._checked_at < CHECK_S and elapsed_s < self.longest_s:
            return None
        cpu = read_cpu()
        if cpu is None:
            self.stop = "timeout"  # what it ran cannot be told: the source's, as a limit always was
        elif cpu >= self.had_its_cpu * self.limit_s:
            self.stop = "timeout"
        elif elapsed_s >= self.longest_s:
            self.stop = "held"
        else:
            if self.cpu_s is None or cpu - self.cpu_s >= PROGRESS_S:
                self._progress_at = elapsed_s
            elif elapsed_s - self._progress_at >= self.stall_s:
                self.stop = "held"
        self.cpu_s = cpu if cpu is not None else self.cpu_s
        self._checked_at = elapsed_s
        return self.stop

    def next_check_s(self, elapsed_s: float) -> float:
        """Seconds until :meth:`decide` next has something to look at."""
        if elapsed_s < self.limit_s:
            return self.limit_s - elapsed_s
        return max(min(CHECK_S, self.longest_s - elapsed_s), 0.0)

    def reason(self) -> str:
        """Why the compile was stopped, for its error message."""
        ran = f"{self.cpu_s:.1f} s" if self.cpu_s is not None else "an unknown time"
        if self.stop == "held":
            return (
                f"the compiler had run only {ran} on a CPU when it was stopped (its limit: {self.limit_s:g} s, "
                f"stretched up to {self.longest_s:g} s while it kept running): the machine held it back (overloaded, "
                "paused or its disk stalled)"
            )
        return f"the compiler kept a CPU busy for {ran} and reached its limit of {self.limit_s:g} s"

    def watch(self, read_cpu: Callable[[], float | None]) -> Callable[[], str | None]:
        """A sandbox watch (SandboxProcess.finish) that stops the compile by this rule, timed from now."""
        started = time.monotonic()

        def check() -> str | None:
            return self.reason() if self.decide(time.monotonic() - started, read_cpu) else None

        return check
