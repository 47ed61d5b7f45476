"""How a GPU kernel is timed, honestly.

1. Every contender of a benchmark (the candidate, the incumbent or seed, the library baseline) runs in ONE
   sandboxed CUDA child, each kernel in a cuModule of its own. On a CPU each contender needs a process of
   its own because the candidate's host code could tamper with the clock or with the others; a CUDA
   candidate has no host code at all -- it is device code, launched and timed by our code -- so it can
   neither see nor touch the events, the other modules' memory mappings or the timing loop. What it can do
   on the device (write out of bounds, keep state in ``__device__`` globals across calls) is caught by the
   guards, the rotating buffers below and the output checks, not by process boundaries.
2. The clock is the GPU's: a CUDA event recorded on the stream right before the launch and one right after;
   ``cuEventElapsedTime`` is the device time between them (resolution about 0.5 us). The host's own clock,
   Python's overhead and the pipe never enter the figure.
3. The L2 cache is flushed before every timed call by writing :func:`l2_flush_bytes` (twice the L2 size)
   into a scratch buffer, outside the timed region: every call reads its inputs from HBM, as a kernel in a
   real pipeline does after other work, and no contender inherits another's warm cache.
4. Several input sets are resident and cycled (:func:`rotation_plan`), with output slots on a period one
   longer, so consecutive calls never see the same input/output pointers: a kernel that caches its answer
   by pointer in a device global returns another input's answer and fails the output check. And, as on the
   CPU, each use of an input set changes one element slightly, drawn at random for each use (protocol.BUMP_STEP,
   outside the timed region), so no input repeats exactly, an answer remembered by (input, output) pair is
   stale, and finding what changed means reading the whole input. A kernel that does read it all and patches
   what it kept still skips its work in the rounds: after them each contender is timed on input sets no call has
   read (engine/harness/cuda/judge.py _fresh_probe), and one more than twice as slow there is ``impossible``.
5. Rounds interleave the contenders (A B C, B C A, C A B, ...: :func:`round_order`), so slow drift (clocks,
   temperature, a neighbour on the PCIe bus) hits every contender alike; the parent pairs the calls of a
   round and computes the ratio with its confidence interval (engine.harness.stats).
6. A timed job holds its GPU alone (engine/harness/cuda/lease.py), and a result faster than the measured
   HBM bandwidth allows is rejected as impossible (engine/harness/cuda/bandwidth.py).

The rules are pure functions, tested on the CPU; :class:`EventClock` is the part that runs in the child.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from engine.harness.cuda.device import Gpu

MIB = 1 << 20
# The flush writes at least this multiple of the L2 size: with an LRU-like policy one L2's worth of writes
# evicts most lines, two evict them all even with a hashed set mapping.
FLUSH_L2_MULTIPLE = 2
MIN_FLUSH_BYTES = 4 * MIB
# When the driver does not report the L2 size: more than any GPU's L2 so far (B200: 126 MiB).
UNKNOWN_L2_FLUSH_BYTES = 512 * MIB
# Input sets resident at once, at most (each is a fresh draw from Problem.make_inputs), and at most this many
# bytes of them per shape beyond the first two sets: sets of hundreds of MiB take seconds to draw and send,
# and two sets with three output slots already keep every (input, output) pair from repeating soon.
MAX_INPUT_SETS = 4
INPUT_POOL_BYTES = 512 << 20
# The share of the free device memory a benchmark's buffers may take (the rest: CuPy's pool, fragmentation).
MEMORY_SHARE = 0.5
# A batch of timed rounds lasts about this long on the GPU, so the pipe round trip is rare but a hang is
# noticed quickly; never more rounds per batch than MAX_ROUNDS_PER_BATCH.
TARGET_BATCH_NS = 50_000_000
MAX_ROUNDS_PER_BATCH = 200


class RotationError(ValueError):
    """A benchmark shape's buffers do not fit in the device's free memory."""


def l2_flush_bytes(l2_bytes: int) -> int:
    """Bytes the flush before each timed call writes: FLUSH_L2_MULTIPLE × the L2 size (at least
    MIN_FLUSH_BYTES), rounded up to a MiB; UNKNOWN_L2_FLUSH_BYTES when the L2 size is unknown (0)."""
    if l2_bytes <= 0:
        return UNKNOWN_L2_FLUSH_BYTES
    wanted = max(FLUSH_L2_MULTIPLE * l2_bytes, MIN_FLUSH_BYTES)
    return -(-wanted // MIB) * MIB


@dataclass(frozen=True)
class RotationPlan:
    """How many input sets are resident and how many output slots each contender cycles through."""

    in_slots: int
    out_slots: int

    @property
    def coprime(self) -> bool:
        return math.gcd(self.in_slots, self.out_slots) == 1


def rotation_plan(
    input_bytes: int, output_bytes: int, contenders: int, free_bytes: int, flush_bytes: int
) -> RotationPlan:
    """The most input sets (up to MAX_INPUT_SETS, and beyond two only while they total INPUT_POOL_BYTES) whose
    buffers, with ``in_slots + 1`` output slots for each of ``contenders`` and the flush buffer, fit in
    MEMORY_SHARE of ``free_bytes``; RotationError when not even one set does."""
    available = int(free_bytes * MEMORY_SHARE) - flush_bytes
    wanted = max(2, min(MAX_INPUT_SETS, INPUT_POOL_BYTES // max(1, input_bytes)))
    for n in range(wanted, 0, -1):
        if n * input_bytes + contenders * (n + 1) * output_bytes <= available:
            return RotationPlan(in_slots=n, out_slots=n + 1)
    need = input_bytes + 2 * contenders * output_bytes + flush_bytes
    raise RotationError(
        f"one input set ({input_bytes} bytes) and two output slots for each of {contenders} contender(s) "
        f"({output_bytes} bytes each) plus the L2 flush buffer ({flush_bytes} bytes) need {need} bytes; "
        f"the GPU has {free_bytes} bytes free, of which a benchmark uses {MEMORY_SHARE:.0%}: use smaller "
        "benchmark shapes or a GPU with more memory"
    )


def round_order(contenders: Sequence[int], round_index: int) -> list[int]:
    """The contenders of round ``round_index``: the list rotated by one per round (A B C, B C A, C A B), so
    each contender takes every position equally often."""
    if not contenders:
        return []
    k = round_index % len(contenders)
    return [*contenders[k:], *contenders[:k]]


def rounds_per_batch(round_ns: float) -> int:
    """Timed rounds per command, from one round's estimated device time (flushes included)."""
    if round_ns <= 0:
        return MAX_ROUNDS_PER_BATCH
    return max(1, min(MAX_ROUNDS_PER_BATCH, int(TARGET_BATCH_NS // round_ns)))


class TimedCall(Protocol):
    """One contender's next call in the child: ``prepare`` queues what must happen before it and outside the
    timed region (restoring an in-out state); ``launch`` queues the call itself."""

    def prepare(self) -> None: ...

    def launch(self) -> None: ...


class EventClock:
    """Times calls on the GPU (in the child): flush, start event, the call, end event, all queued on one
    stream; one synchronization per batch, then the event pairs are read."""

    def __init__(self, gpu: Gpu, flush_bytes: int) -> None:
        self.gpu = gpu
        self.flush_bytes = flush_bytes
        self.flush_buffer = gpu.alloc(flush_bytes)
        self.flushes = 0
        self.events: list[Any] = []

    def close(self) -> None:
        self.gpu.free(self.flush_buffer)

    def flush(self) -> None:
        """Write the whole scratch buffer (a different byte each time): evicts the L2."""
        self.flushes += 1
        self.gpu.fill_bytes(self.flush_buffer, self.flushes, self.flush_bytes)

    def _events(self, count: int) -> list[Any]:
        while len(self.events) < count:
            self.events.append(self.gpu.event())
        return self.events[:count]

    def time(self, calls: Sequence[TimedCall]) -> list[float]:
        """Device nanoseconds of each call, in order; each call flushed first, outside its events."""
        events = self._events(2 * len(calls))
        for k, call in enumerate(calls):
            call.prepare()
            self.flush()
            self.gpu.record(events[2 * k])
            call.launch()
            self.gpu.record(events[2 * k + 1])
        self.gpu.synchronize()
        return [self.gpu.elapsed_ns(events[2 * k], events[2 * k + 1]) for k in range(len(calls))]
