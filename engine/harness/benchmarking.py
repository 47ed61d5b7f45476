"""Benchmarking: how much faster is a candidate than its reference points, on this noisy machine?

How a candidate is timed, in one place:

1. every contender (the candidate, the incumbent or a seed, numpy's baseline) runs in a sandboxed worker
   process of its own, all pinned to the same leased CPUs (engine/harness/driver.py): nothing the candidate
   can still do reaches the others or the clock;
2. per benchmark shape, each worker builds a pool of input sets from recorded seeds (bigger than the
   last-level cache where the memory cap allows, so calls read memory rather than a warm cache) and a pool
   of output buffers whose period is coprime with it (a kernel that skips work on a pointer it has seen
   finds another input's answer in its output); each reuse of an input set changes one element, another for
   each call, slightly, so no input repeats exactly and a kernel cannot know where it changed without reading
   all of it (reading is cheaper than computing for some kernels: step 7);
3. the parent times batches of calls with its own monotonic clock, from the Go it writes to the Done it
   reads; a batch is sized from warm-up so that the pipe handshake (measured with empty batches) is well
   under 1% of it (``handshake_share`` in the report);
4. timed rounds: one batch per contender per round, in a fresh random order each round, until the shape's
   share of the time budget (in proportion to its weight) is spent;
5. every batch copies aside the output of one call the parent draws in secret, anywhere in the batch (every
   contender's, so all pay the same copy); after a few rounds drawn in secret the parent fetches the candidate's
   and checks it against the reference computed from the same seed and drift, and the very last call's too (a
   kernel that is only wrong when timed, or skips the calls of a batch it guesses are never looked at, is
   caught: a fetch that could reach back only over the output slots never saw the head of a long batch);
6. each fetched output is checked against the call it must be by this process's count of the calls it asked
   for (the drift's element is a function of the call, protocol.drift_position): the worker keeps its own
   count in the kernel's address space, where a kernel that cut its batch loop short rewrote it;
7. the candidate is timed on inputs no call has read (_fresh_probe): a kernel that reused earlier calls' work
   on the reused input slots is slower there by what it skipped, and its timing is ``impossible``;
8. the candidate is validated again in the same process with every validation seed (a kernel that turns
   wrong after N calls is caught).

The parent computes per-shape paired median ratios of per-call times and their weighted geometric mean
with block-bootstrap intervals at the requested confidence, widened by this machine's measured run-level
noise floor (engine.harness.stats, engine.harness.noise), and rejects a candidate measured faster than the
roofline bound allows (``impossible``): bytes moved / measured bandwidth or flops / measured peak,
whichever is larger, with a generous safety factor (engine.harness.machine).
"""

from __future__ import annotations

import functools
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from engine.errors import ProblemDefinitionError
from engine.hardware import MachineLimits, hardware_fingerprint
from engine.harness import protocol as p
from engine.harness.contention import CoreWatch
from engine.harness.driver import Contender, Failed
from engine.harness.fresh_probe import microseconds, probes_spread_s, reuse_seen
from engine.harness.input_memo import memoized_inputs
from engine.harness.machine import EXCLUSIVE_WAIT_S, MAX_POOL_BYTES, machine_limits
from engine.harness.sandbox import CpuLease, SandboxLimits
from engine.harness.stats import speedup_with_intervals, weighted_geomean
from engine.harness.validation import (
    DEFAULT_CALL_TIMEOUT_S,
    TrialRunner,
    accepts_zeros,
    address_space_limit,
    compare_output,
    constant_answer,
    output_values,
    plan_trials,
    trial_seed,
)
from engine.harness.verdicts import CPU_MEASUREMENT_METHOD, BenchmarkReport, CaseEvidence, ShapeTiming, Verdict
from engine.problems import DTYPES, Problem

__all__ = ["DEFAULT_BUDGET_S", "Reference", "benchmark_artifact", "machine_limits", "pool_slots", "roofline_ns"]

DEFAULT_BUDGET_S = 2.0
# A pool of inputs at least this many times the LLC, so most calls miss the cache ...
POOL_LLC_MULTIPLE = 1.5
# ... but never more memory than MAX_POOL_BYTES (machine.py), nor more slots than this.
MAX_POOL_SLOTS = 64
# A candidate must be more than this many times faster than the roofline bound to be called impossible.
# Generous on purpose: bandwidth and peak are measured with numpy and BLAS on a shared machine, which a
# hand-tuned kernel (non-temporal stores, data still in cache) can beat; the gaming this catches (work
# skipped on timed calls) is orders of magnitude below the bound, not a factor of two.
ROOFLINE_SAFETY = 8.0
# Timed candidate outputs fetched and checked per shape: the first round's, the last call's, and random
# recent ones after random rounds in between.
CHECKED_TIMED_CALLS = 4
# ... and, past the first MIN_ROUNDS rounds, each round's kept output with this chance, drawn as the round
# ends: a kernel that counts rounds and skips the work of those after the tenth is caught in every stretch of
# them (skipping half of 40 such rounds goes unseen with chance 0.8^20, about 1%).
LATE_CHECK_RATE = 0.2
# A batch lasts this many handshakes (the handshake is then 0.5% of it) where the shape's budget allows
# MIN_ROUNDS rounds of such batches, and never fewer than MIN_HANDSHAKE_MULTIPLE (1%) ...
HANDSHAKE_MULTIPLE = 200
MIN_HANDSHAKE_MULTIPLE = 100
# ... and at least this long; never more calls than this.
MIN_BATCH_NS = 1_000_000
MAX_BATCH_CALLS = 1 << 16
PAGE = 4096
HANDSHAKE_PINGS = 7
WARMUP_FRACTION = 0.1
WARMUP_ROUNDS = 3
MIN_ROUNDS = 10
MAX_ROUNDS = 100_000
# A per-call time estimated below one handshake is checked with batches RAMP_FACTOR times longer each, until one
# lasts RAMP_HANDSHAKES handshakes; the check's reading wins when it is over RAMP_TRUST times the estimate.
RAMP_FACTOR = 8
RAMP_HANDSHAKES = 10
RAMP_TRUST = 2.0
# The fresh-input probe (_fresh_probe; its rule, engine.harness.fresh_probe): none where a probe batch would last
# under this many handshakes.
FRESH_MIN_HANDSHAKES = 5
# ... and this many of each probe batch's outputs, drawn after it, are fetched and checked; a probe batch
# reads as many input slots as last this long.
FRESH_CHECKED = 2
FRESH_BATCH_NS = 10_000_000


class Reference(BaseModel):
    """A reference point a candidate is timed against."""

    kind: Literal["numpy", "artifact"] = Field(description="numpy: the problem's baseline(); artifact: a library.")
    artifact_id: str | None = Field(default=None, description="The compiled library, for kind artifact.")
    label: str = Field(description="Name in reports, e.g. numpy, seed, incumbent.")


def _bytes_of(problem: Problem, shape: dict[str, int], roles: Sequence[str]) -> int:
    return sum(
        int(np.prod(q.dims(shape), dtype=np.int64)) * np.dtype(DTYPES[q.dtype]).itemsize
        for q in problem.params
        if q.role in roles
    )


def pool_slots(problem: Problem, shape: dict[str, int], llc: int) -> tuple[int, int, int]:
    """(input slots, output slots, pool bytes) for a shape: above POOL_LLC_MULTIPLE × LLC where the caps
    allow; the output period is the input period + 1 (coprime)."""
    in_bytes = _bytes_of(problem, shape, ("in", "inout"))
    out_bytes = _bytes_of(problem, shape, ("out", "inout"))
    per_slot = max(1, in_bytes + out_bytes)
    wanted = math.ceil(POOL_LLC_MULTIPLE * llc / per_slot)
    affordable = MAX_POOL_BYTES // per_slot
    slots = max(2, min(wanted, affordable, MAX_POOL_SLOTS))
    return slots, slots + 1, slots * in_bytes + (slots + 1) * out_bytes


def roofline_ns(problem: Problem, shape: dict[str, int], limits: MachineLimits, pool_bytes: int, threads: int) -> float:
    """Physical lower bound of one call: max(bytes / bandwidth, flops / peak), nanoseconds, both scaled by
    the thread count (generous: perfect scaling)."""
    model = problem.roofline(shape)
    bandwidth = roofline_bandwidth_gbs(limits, pool_bytes) * threads
    return max(float(model.get("bytes", 0)) / bandwidth, float(model.get("flops", 0)) / limits.peak_gflops)


def roofline_bandwidth_gbs(limits: MachineLimits, pool_bytes: int) -> float:
    """The bandwidth a shape's calls stream at: the measured streaming bandwidth when its pool is above the
    LLC or as large as the working set that bandwidth was measured on (half of it or more), else the cache's,
    which bounds every cache level from above (a safe bound; the fraction may then read low)."""
    streams = pool_bytes > limits.llc_bytes or 2 * pool_bytes >= limits.stream_bytes
    return limits.dram_bandwidth_gbs if streams else limits.cache_bandwidth_gbs


def benchmark_limits(
    problem: Problem, shapes: list[tuple[dict[str, int], float]], pools: list[int], budget_s: float
) -> SandboxLimits:
    """Limits of one contender's worker: the whole budget plus slack, memory for its pools and a trial."""
    return SandboxLimits(
        wall_seconds=240 + 3 * budget_s,
        cpu_seconds=int(300 + 3 * budget_s),
        address_space_bytes=address_space_limit(
            problem, [s for s, _ in shapes] + problem.validation_shapes, extra=2 * max(pools)
        ),
        file_size_bytes=64 << 20,
    )


class _ShapeTimer:
    """Times one shape: handshake, warm-up (which sizes the batches), then interleaved timed rounds."""

    def __init__(self, contenders: list[Contender], budget_ns: int, call_timeout_s: float, rng: random.Random) -> None:
        self.contenders = contenders
        self.budget_ns = budget_ns
        self.call_timeout_s = call_timeout_s
        self.rng = rng
        self.calls = [1] * len(contenders)
        self.per_call_ns = [0.0] * len(contenders)
        self.handshake_ns = 0.0
        self.batch_ns: list[float] = []
        # The shape's budget covers everything from its first handshake: warm-up, rounds and output checks.
        self.started = time.perf_counter_ns()

    def _batch(self, which: int) -> float:
        contender = self.contenders[which]
        calls = self.calls[which]
        timeout = self.call_timeout_s + 20 * calls * self.per_call_ns[which] / 1e9
        keep = _SECRET.randrange(calls) if calls else -1
        elapsed = contender.timed_batch(calls, timeout, keep)
        contender.pause()
        return elapsed

    def handshake(self) -> None:
        self.started = time.perf_counter_ns()
        pings = []
        for _ in range(HANDSHAKE_PINGS):
            for which in range(len(self.contenders)):
                self.calls[which] = 0
                pings.append(self._batch(which))
        self.handshake_ns = float(statistics.median(pings))

    def warm_up(self) -> None:
        """Single-call batches until the warm-up share of the budget is spent; then batch sizes."""
        self.calls = [1] * len(self.contenders)
        times: list[list[float]] = [[] for _ in self.contenders]
        order = list(range(len(self.contenders)))
        rounds = 0
        while rounds < WARMUP_ROUNDS or time.perf_counter_ns() - self.started < self.budget_ns * WARMUP_FRACTION:
            self.rng.shuffle(order)
            for which in order:
                times[which].append(self._batch(which))
            rounds += 1
        for which, samples in enumerate(times):
            single = float(np.median(samples[len(samples) // 2 :]))
            self.per_call_ns[which] = max(single - self.handshake_ns, 1.0)
            if self.per_call_ns[which] < self.handshake_ns:
                self.per_call_ns[which] = self._verified_per_call(which, single)
        # One batch size for every contender, from the fastest one's time (paired batches do the same work):
        # 200 handshakes long where the budget allows MIN_ROUNDS rounds of them (a round runs every
        # contender's batch), never under 100 handshakes (1%) or MIN_BATCH_NS.
        fastest, round_ns = min(self.per_call_ns), sum(self.per_call_ns)
        ideal = math.ceil(HANDSHAKE_MULTIPLE * self.handshake_ns / fastest)
        floor = math.ceil(max(MIN_HANDSHAKE_MULTIPLE * self.handshake_ns, MIN_BATCH_NS) / fastest)
        affordable = int(self.budget_ns * (1 - 2 * WARMUP_FRACTION) / MIN_ROUNDS / round_ns)
        calls = max(1, min(MAX_BATCH_CALLS, max(floor, min(ideal, affordable))))
        self.calls = [calls] * len(self.contenders)

    def _verified_per_call(self, which: int, single_ns: float) -> float:
        """The per-call time of a contender whose single-call batches hardly outlast the handshake, checked with
        batches RAMP_FACTOR times longer each, until one lasts RAMP_HANDSHAKES handshakes (or MAX_BATCH_CALLS).

        Why: read as a single call less the handshake, such a time is a difference of two noisy medians. On a
        loaded machine the handshake can read as long as a real call (a ping waits for a core too), and a
        150 us kernel then read as 1 ns: its batches were sized at MAX_BATCH_CALLS, ran past their timeout, and a
        harness timeout stood where a measurement should have been. The check costs about RAMP_HANDSHAKES
        handshakes. Its reading replaces the estimate only when it is more than RAMP_TRUST times longer (the
        batches would have run too long); a shorter one keeps the estimate, so a kernel far below the handshake
        is batched as before."""
        estimate = self.per_call_ns[which]
        # Each ramp batch's timeout assumes every call as long as a whole single-call batch, an upper bound.
        self.per_call_ns[which] = max(single_ns, 1.0)
        calls = 1
        while True:
            calls = min(calls * RAMP_FACTOR, MAX_BATCH_CALLS)
            self.calls[which] = calls
            elapsed = self._batch(which)
            if elapsed >= RAMP_HANDSHAKES * self.handshake_ns or calls >= MAX_BATCH_CALLS:
                break
        self.calls[which] = 1
        verified = max((elapsed - self.handshake_ns) / calls, 1.0)
        return verified if verified > RAMP_TRUST * estimate else estimate

    def rounds(self, after_candidate: Any) -> np.ndarray:
        """Per-call nanoseconds by round and contender; ``after_candidate(round)`` runs after the candidate's
        batch of each round (outside any timed region)."""
        samples: list[list[float]] = []
        order = list(range(len(self.contenders)))
        while True:
            row = [0.0] * len(order)
            self.rng.shuffle(order)
            for which in order:
                elapsed = self._batch(which)
                self.batch_ns.append(elapsed)
                # Less the handshake (an empty batch's median): every contender's batch carries the same.
                row[which] = max(elapsed - self.handshake_ns, 1.0) / self.calls[which]
                if which == 0:
                    after_candidate(len(samples))
            samples.append(row)
            spent = time.perf_counter_ns() - self.started
            if len(samples) >= MAX_ROUNDS or (len(samples) >= MIN_ROUNDS and spent >= self.budget_ns):
                return np.asarray(samples, dtype=np.float64)


def benchmark_artifact(
    problem: Problem,
    artifact_id: str,
    references: Sequence[Reference],
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    threads: int = 1,
    seed: int = 0,
    cache_dir: Path | None = None,
    revalidate: bool = True,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    isolation: str = "auto",
    confidence: float = 0.95,
    noise_floor: float | None = None,
) -> list[BenchmarkReport]:
    """Time the candidate against every reference point, each in a sandboxed worker of its own, interleaved
    by this process's clock; one report per reference, in order. ``budget_s`` is the time over all shapes
    (warm-up included), split by the shapes' weights; a shape's share is exceeded where MIN_ROUNDS rounds of
    batches of the least length (see _ShapeTimer.warm_up) take longer. ``noise_floor`` None uses this
    machine's measured run-level floor."""
    if not references:
        raise ValueError(
            "benchmark_artifact needs at least one reference point, e.g. Reference(kind='numpy', label='numpy')"
        )
    for reference in references:
        if reference.kind == "artifact" and not reference.artifact_id:
            raise ValueError(f"reference {reference.label!r} is an artifact without an artifact_id")
    started = time.perf_counter()
    limits_hw = machine_limits(threads, cache_dir, isolation=isolation)
    if noise_floor is None:
        from engine.harness.noise import machine_noise_floor

        noise_floor = machine_noise_floor(threads, cache_dir, isolation=isolation).floor
    fingerprint = hardware_fingerprint(threads).model_copy(
        update={"memory_bandwidth_gbs": limits_hw.dram_bandwidth_gbs, "peak_gflops": limits_hw.peak_gflops}
    )
    shapes = problem.benchmark_shapes
    definition = problem.fingerprint()
    distribution = problem.timed_distribution
    slots = [pool_slots(problem, shape, limits_hw.llc_bytes) for shape, _ in shapes]
    pools = [pool for _, _, pool in slots]
    limits = benchmark_limits(problem, shapes, pools, budget_s)
    total_weight = sum(w for _, w in shapes)
    lease = CpuLease(threads, wait_s=EXCLUSIVE_WAIT_S)
    shared = SharedPool(
        max(_bytes_of(problem, shape, ("in", "inout")) * n for (shape, _), (n, _, _) in zip(shapes, slots, strict=True))
    )
    contenders: list[Contender] = []
    # Work from outside the benchmark on the leased CPUs while shapes are timed (a busy machine's reading).
    cores = CoreWatch(lease.cpus, lambda: _workers_cpu_ns(contenders))
    labels = [r.label for r in references]
    state: dict[str, Any] = {"phase": "loading", "shape": {}}
    runner: TrialRunner | None = None
    handshake_shares: list[float] = []
    common: dict[str, Any] = {
        "threads": threads,
        "hardware": fingerprint,
        "confidence": confidence,
        "method": CPU_MEASUREMENT_METHOD,
    }

    def failed(verdict: Verdict, evidence: CaseEvidence) -> list[BenchmarkReport]:
        return [
            BenchmarkReport(
                verdict=verdict,
                reference=label,
                speedup=0.0,
                ci_low=0.0,
                ci_high=0.0,
                cases=[evidence],
                message=evidence.message,
                revalidated=False,
                cpus_exclusive=lease.exclusive,
                seconds=time.perf_counter() - started,
                **common,
            )
            for label in labels
        ]

    try:
        # Every worker starts at once (they import in parallel) while the first pool is generated here.
        contenders.append(
            Contender(
                problem,
                label="candidate",
                kind="artifact",
                artifact_id=artifact_id,
                threads=threads,
                cpus=lease.cpus,
                limits=limits,
                cache_dir=cache_dir,
                isolation=isolation,
                problem_py=False,  # its inputs come from this process; only numpy needs the module
                pool_fd=shared.reader,
                wait=False,
            )
        )
        for j, reference in enumerate(references):
            contenders.append(
                Contender(
                    problem,
                    label=f"ref{j}",
                    kind=reference.kind,
                    artifact_id=reference.artifact_id,
                    threads=threads,
                    cpus=lease.cpus,
                    limits=limits,
                    cache_dir=cache_dir,
                    isolation=isolation,
                    problem_py=reference.kind == "numpy",
                    pool_fd=shared.reader,
                    wait=False,
                )
            )
        rng = random.Random(seed * 1000003 + 17)
        samples: list[np.ndarray] = []
        timed_ns = 0.0
        for s, (shape, weight) in enumerate(shapes):
            n_in, n_out, _ = slots[s]
            state.update(phase="benchmark", shape=shape)
            seeds = [trial_seed(seed, "benchmark", s, distribution, i) for i in range(n_in)]
            kept: dict[int, dict[str, Any]] = {}
            prepare = _input_pool(problem, shape, distribution, seeds, n_out, shared, kept, definition)
            if s == 0:
                for contender in contenders:
                    contender.wait_ready()
            for contender in contenders:
                reply, _ = contender.request(prepare, timeout=call_timeout_s + 60, what="taking the input pool")
                contender.pause()  # nothing of it runs while the others take theirs and are timed
                if isinstance(reply, p.Failure):
                    raise Failed(Verdict.harness_error, "memory", reply.message, who=contender.label)
            timer = _ShapeTimer(contenders, int(budget_s * 1e9 * weight / total_weight), call_timeout_s, rng)
            cores.start()
            fresh_pool = functools.partial(_fresh_pool, problem, shape, distribution, len(seeds), n_out, shared, kept)
            rows, problem_seen = _time_shape(problem, timer, prepare, distribution, call_timeout_s, kept, fresh_pool)
            cores.stop()
            del kept
            if problem_seen is not None:
                # Reused work is a timing that cannot be trusted, as one under the roofline bound is.
                reused = problem_seen.check == "fresh_inputs"
                return failed(Verdict.impossible if reused else Verdict.incorrect, problem_seen)
            samples.append(rows)
            timed_ns += float(sum(timer.batch_ns))
            handshake_shares.append(timer.handshake_ns / max(float(np.median(timer.batch_ns)), 1.0))
        revalidated = False
        if revalidate:
            state.update(phase="revalidation", shape={})
            runner = TrialRunner(problem, contenders[0], call_timeout_s)
            groups = plan_trials(problem, "revalidation", 3, seed)
            evidence = runner.run(groups, extra_checks=False)
            if evidence is not None:
                return failed(Verdict.incorrect, evidence)
            revalidated = True
        for contender in contenders:
            contender.close()
    except Failed as failure:
        if failure.who != "candidate":
            # A reference point failed: the machine's problem (or the incumbent's), never the candidate's verdict.
            index = int(failure.who[3:]) if failure.who.startswith("ref") else None
            label = labels[index] if index is not None else failure.who
            runs_problem_code = index is not None and references[index].kind == "numpy"
            if runs_problem_code and failure.verdict == Verdict.crash:
                # The numpy reference's worker runs problem.py's code and numpy, no kernel: when it crashes or
                # exits (not killed from outside: that is harness_error), the problem's code did.
                raise ProblemDefinitionError(
                    f"{problem.folder / 'problem.py'}: the numpy reference, which runs make_inputs() and baseline() "
                    f"in a process of its own, {failure.message}; fix baseline() (`kf problem check` runs it on every "
                    "shape)"
                ) from None
            if failure.check == "problem":
                # The numpy reference ran problem.py's baseline, and it raised: bad input, stopping a search.
                raise ProblemDefinitionError(
                    f"{problem.folder / 'problem.py'}: {failure.message}; fix baseline() (`kf problem check` "
                    "runs it on every shape)"
                ) from None
            return failed(Verdict.harness_error, _reference_failed(label, failure))
        if runner is not None and state["phase"] == "revalidation":
            evidence = runner.where(failure.check, failure.message, "revalidation")
        else:
            evidence = CaseEvidence(
                phase=state["phase"], check=failure.check, shape=state["shape"], message=failure.message
            )
        return failed(failure.verdict, evidence)
    finally:
        for contender in contenders:
            contender.discard()
        shared.close()
        lease.release()
    common |= {
        "cpus_exclusive": lease.exclusive,
        "foreign_cpu_share": cores.share(),
        "seconds": time.perf_counter() - started,
        "timed_seconds": timed_ns / 1e9,
        "handshake_share": max(handshake_shares) if handshake_shares else 0.0,
    }
    return _reports(
        problem,
        shapes,
        pools,
        samples,
        references,
        limits_hw,
        threads,
        revalidated,
        common,
        seed,
        confidence,
        noise_floor,
    )


def _workers_cpu_ns(contenders: Sequence[Contender]) -> int | None:
    """The CPU time the contenders' workers have run, in nanoseconds; None where one's cannot be read."""
    total = 0
    for contender in contenders:
        reading = contender.watch.cpu_time() if contender.watch is not None else None
        if reading is None:
            return None
        total += reading.ran_ns
    return total


class SharedPool:
    """The input pools' file: written here once per shape, read by every contender's worker through a
    read-only descriptor (a pipe would copy hundreds of MB to each worker; a writable mapping would let the
    candidate change what the incumbent reads)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.writer = os.memfd_create("kf-input-pool", os.MFD_CLOEXEC)
        os.ftruncate(self.writer, max(size, 1))
        # A read-only descriptor of the same file, for the workers (pass_fds makes it inheritable there).
        self.reader = os.open(f"/proc/self/fd/{self.writer}", os.O_RDONLY | os.O_CLOEXEC)

    def write(self, piece: memoryview, offset: int) -> None:
        if offset + len(piece) > self.size:
            os.ftruncate(self.writer, offset + len(piece))
            self.size = offset + len(piece)
        view = piece.cast("B")
        while view:
            written = os.pwrite(self.writer, view, offset)
            view, offset = view[written:], offset + written

    def close(self) -> None:
        for fd in (self.writer, self.reader):
            os.close(fd)


def _input_pool(
    problem: Problem,
    shape: dict[str, int],
    distribution: str,
    seeds: list[int],
    out_slots: int,
    shared: SharedPool,
    kept: dict[int, dict[str, Any]],
    definition: str | None,
) -> p.PreparePools:
    """One shape's input pool, written here into the shared pool file for every contender (the same inputs,
    the same pages, for all), each array page-aligned; the inputs of a recent benchmark of the same problem
    ``definition`` (fingerprint) and seeds are not generated again (engine/harness/input_memo.py). ``definition``
    None: generated and not kept for another benchmark (a probe's pool of secret seeds)."""
    arrays: list[list[p.ArraySpec]] = []
    scalars: list[dict[str, float | int]] = []
    offset = 0
    for seed in seeds:
        generate = functools.partial(problem.make_inputs, shape, distribution, seed)
        inputs = generate() if definition is None else memoized_inputs(definition, shape, distribution, seed, generate)
        kept[seed] = inputs  # for checking timed outputs without generating them again
        specs = []
        for q in problem.params:
            if q.role in ("in", "inout"):
                array = np.ascontiguousarray(inputs[q.name], dtype=DTYPES[q.dtype])
                shared.write(array.reshape(-1).view(np.uint8).data, offset)
                specs.append(
                    p.ArraySpec(name=q.name, dtype=q.dtype, dims=list(array.shape), nbytes=array.nbytes, offset=offset)
                )
                offset += -(-array.nbytes // PAGE) * PAGE
        arrays.append(specs)
        scalars.append(
            {
                q.name: float(inputs[q.name]) if "float" in q.dtype else int(inputs[q.name])
                for q in problem.params
                if q.role == "scalar"
            }
        )
    return p.PreparePools(
        shape=shape,
        seeds=seeds,
        arrays=arrays,
        scalars=scalars,
        out_slots=out_slots,
        pool_bytes=offset,
        drift_key=_SECRET.getrandbits(63),
    )


def _time_shape(
    problem: Problem,
    timer: _ShapeTimer,
    prepare: p.PreparePools,
    distribution: str,
    call_timeout_s: float,
    kept: dict[int, dict[str, Any]],
    fresh_pool: Callable[[], p.PreparePools],
) -> tuple[np.ndarray, CaseEvidence | None]:
    """Handshake, warm-up and timed rounds of one shape, with the candidate's outputs checked after a few
    random rounds and after the last: per-call times by round, and the first wrong output's evidence.
    ``fresh_pool()``: a new pool of the shape, of secret seeds, for the fresh-input probe of a problem whose
    inputs the judge cannot vary."""
    candidate = timer.contenders[0]
    checked_rounds = _checked_rounds()
    fetched: list[tuple[p.Reply, bytearray, TimedCall]] = []

    def after_candidate(round_index: int) -> None:
        # Only fetched here (the bytes leave the worker before more candidate code runs); judged after the
        # rounds, so computing references does not eat into the timing budget. A checked round's output is
        # its batch's kept call, anywhere in the batch (Go.keep); the very last call is fetched too.
        if round_index >= 0 and not _is_checked(round_index, checked_rounds):
            return
        fetch = p.Fetch(back=0, kept=round_index >= 0)
        # Which call that is, by this process's count of the calls it asked for: the worker's own bookkeeping is
        # in the kernel's reach, so the output is checked against the inputs of the call that must have made it.
        call = candidate.kept_call if fetch.kept else candidate.calls_asked - 1
        expected = _timed_call(problem, prepare, call)
        fetched.append((*candidate.request(fetch, timeout=call_timeout_s, what="fetching outputs"), expected))
        # Stopped again at once: a kernel that took the worker's interpreter over could otherwise run on the CPU
        # while the next contender is timed (the fetch had resumed it).
        candidate.pause()

    timer.handshake()
    timer.warm_up()
    rows = timer.rounds(after_candidate)
    after_candidate(-1)  # the candidate's very last timed call, too
    for reply, data, expected in fetched:
        evidence = check_timed_output(problem, prepare.shape, distribution, reply, data, kept, expected)
        if evidence is not None:
            return rows, evidence
    probed: list[tuple[p.Reply, bytearray, TimedCall]] = []
    reused = _fresh_probe(problem, timer, prepare, rows, probed, fresh_pool)
    for reply, data, expected in probed:  # a probe's outputs are checked too: a fast probe must be a right one
        evidence = check_timed_output(problem, prepare.shape, distribution, reply, data, kept, expected)
        if evidence is not None:
            return rows, evidence
    return rows, reused


def _fresh_probe(
    problem: Problem,
    timer: _ShapeTimer,
    prepare: p.PreparePools,
    rows: np.ndarray,
    fetched: list[tuple[p.Reply, bytearray, TimedCall]],
    fresh_pool: Callable[[], p.PreparePools] | None = None,
) -> CaseEvidence | None:
    """The candidate timed on inputs no call has read (Refresh changes every float input element of the pool a
    little, outside any timed call), one call per input slot read, against its median per-call time in the rounds.

    Why: the rounds reuse each input slot, drifting one element per use, and a kernel that keeps each slot's
    inputs and answers (by pointer or by content) and recomputes only the rows that changed -- or updates its
    last answer algebraically -- gives correct outputs at a fraction of the work (a matmul did so 4x faster than
    its own loops). Real inputs never repeat, so that speed is nobody's. An honest kernel is as fast on the
    refreshed pool (if anything warmer in the cache); one that reused work is slower by what it skipped.

    Each probe batch's calls write an output slot each (there is one more output slot than input slots), and
    FRESH_CHECKED of them, drawn after the batch, are fetched into ``fetched`` for checking: a kernel that
    skips the work on a probe it recognises is wrong there. Each probe (on a newly refreshed pool) is followed by
    one of the first reference, drawn the same way, and only a candidate slower than the machine explains in every
    pair, spread out in time, is a finding (engine.harness.fresh_probe.reuse_seen). Skipped where a probe batch
    would last under FRESH_MIN_HANDSHAKES handshakes (too short to read).

    Where no input can be varied (integer inputs only: a changed index or count could be one the problem never
    allows), each probe's pool is a new one instead, drawn by make_inputs with secret seeds (``fresh_pool``), and
    the probe batch reads each of its slots once; without ``fresh_pool`` such a problem is not probed."""
    varied = bool(p.varied(problem.params))
    if not varied and fresh_pool is None:
        return None
    timed_ns = float(np.median(rows[:, 0]))
    # Every input slot is refreshed; a probe batch reads as many as last FRESH_BATCH_NS (a slow kernel's 64 slots
    # took half a second a probe), at least two.
    calls = min(len(prepare.seeds), max(2, math.ceil(FRESH_BATCH_NS / timed_ns)))
    if calls * timed_ns < FRESH_MIN_HANDSHAKES * timer.handshake_ns:
        return None
    candidate = timer.contenders[0]
    refreshed: list[int] = []
    pool = prepare

    def probe_candidate() -> float:
        nonlocal pool
        if varied:
            refreshed.append(_SECRET.getrandbits(63))
            fresh = _refreshed_per_call(timer, candidate, calls, timed_ns, refreshed[-1])
        else:
            assert fresh_pool is not None
            pool = fresh_pool()
            fresh = _new_pool_per_call(timer, candidate, calls, timed_ns, pool)
        for back in sorted(_SECRET.sample(range(calls), min(FRESH_CHECKED, calls))):
            asked = _timed_call(problem, pool, candidate.calls_asked - 1 - back, refreshed)
            reply, data = candidate.request(p.Fetch(back=back), timeout=timer.call_timeout_s, what="fetching outputs")
            candidate.pause()  # before the reference's control batch, as after a round's fetch
            fetched.append((reply, data, asked))
        return fresh / timed_ns

    probe_reference: Callable[[], float] | None = None
    if len(timer.contenders) > 1:
        reference = timer.contenders[1]
        reference_ns = float(np.median(rows[:, 1]))

        def probe_reference() -> float:
            if varied:
                again = _refreshed_per_call(timer, reference, calls, reference_ns, _SECRET.getrandbits(63))
            else:
                again = _new_pool_per_call(timer, reference, calls, reference_ns, pool)
            return again / reference_ns

    pairs = reuse_seen(probe_candidate, probe_reference)
    if pairs is None:
        return None
    fastest = min(pairs, key=lambda pair: pair.candidate)
    control = ""
    controls = [pair.reference for pair in pairs if pair.reference is not None]
    if controls:
        drawn = "inputs refreshed the same way" if varied else "new pools drawn the same way"
        pace = f"{min(controls):.1f}-{max(controls):.1f}x"
        control = f"; the reference, probed after each, ran at {pace} its own pace on {drawn}"
    return CaseEvidence(
        phase="benchmark",
        check="fresh_inputs",
        shape=prepare.shape,
        message=(
            f"{fastest.candidate:.1f}x slower on inputs no call had read ({microseconds(fastest.candidate * timed_ns)} "
            f"per call, the best of {len(pairs)} probes spread over {probes_spread_s(len(pairs)):.1f} s) "
            f"than in the timed rounds ({microseconds(timed_ns)}, their median){control}: its "
            "timed calls did less than their work, reusing that of earlier calls on inputs it had seen (or skipping "
            "calls), which real inputs never allow; compute each call's answer from its inputs"
        ),
    )


def _new_pool_per_call(
    timer: _ShapeTimer, contender: Contender, calls: int, per_call_ns: float, pool: p.PreparePools
) -> float:
    """Per-call nanoseconds of one batch of ``calls`` calls on ``contender`` just given the new ``pool`` (its
    calls read the slots in turn from the first, each once while ``calls`` is at most the pool's slots)."""
    reply, _ = contender.request(pool, timeout=timer.call_timeout_s + 60, what="taking a new input pool")
    contender.pause()  # the batch resumes it
    if isinstance(reply, p.Failure):
        raise Failed(Verdict.harness_error, "memory", reply.message, who=contender.label)
    elapsed = contender.timed_batch(calls, timer.call_timeout_s + 20 * calls * per_call_ns / 1e9, -1)
    contender.pause()
    return max(elapsed - timer.handshake_ns, 1.0) / calls


def _fresh_pool(
    problem: Problem,
    shape: dict[str, int],
    distribution: str,
    slots: int,
    out_slots: int,
    shared: SharedPool,
    kept: dict[int, dict[str, Any]],
) -> p.PreparePools:
    """A new input pool of ``shape`` (``slots`` input slots) drawn with secret seeds, written over the shared pool
    file: the fresh-input probe's inputs for a problem whose inputs cannot be varied. Its inputs are added to
    ``kept`` (the probe's outputs are checked against them)."""
    seeds = [_SECRET.getrandbits(63) for _ in range(slots)]
    return _input_pool(problem, shape, distribution, seeds, out_slots, shared, kept, None)


def _refreshed_per_call(timer: _ShapeTimer, contender: Contender, calls: int, per_call_ns: float, seed: int) -> float:
    """Per-call nanoseconds of one batch of ``calls`` calls on ``contender``'s pool just refreshed with ``seed``."""
    reply, _ = contender.request(p.Refresh(seed=seed), timeout=timer.call_timeout_s + 60, what="refreshing the inputs")
    contender.pause()  # the batch resumes it
    if isinstance(reply, p.Failure):
        raise Failed(Verdict.harness_error, "memory", reply.message, who=contender.label)
    elapsed = contender.timed_batch(calls, timer.call_timeout_s + 20 * calls * per_call_ns / 1e9, -1)
    contender.pause()
    return max(elapsed - timer.handshake_ns, 1.0) / calls


class TimedCall(BaseModel):
    """A timed call's inputs, as the judge works them out from the calls it asked for."""

    call: int = Field(description="The call of the shape, from 0.")
    seed: int = Field(description="The seed of the input slot it read.")
    bump: int = Field(description="The drift step of that use (-1: no input drifts).")
    position: int = Field(description="The element the drift changed.")
    refreshes: list[int] = Field(default_factory=list, description="The Refresh seeds applied before it, in order.")


def _timed_call(problem: Problem, prepare: p.PreparePools, call: int, refreshes: Sequence[int] = ()) -> TimedCall:
    slot, bump = p.timed_call_inputs(call, len(prepare.seeds))
    known = {"call": call, "seed": prepare.seeds[slot], "refreshes": list(refreshes)}
    drifting = next(iter(p.varied(problem.params)), None)
    if drifting is None:
        return TimedCall(**known, bump=-1, position=0)
    size = int(np.prod(drifting.dims(prepare.shape), dtype=np.int64))
    return TimedCall(**known, bump=bump, position=p.drift_position(prepare.drift_key, call, size))


def _reference_failed(label: str, failure: Failed) -> CaseEvidence:
    return CaseEvidence(
        phase="benchmark",
        check="reference",
        message=(
            f"the reference point {label!r} failed ({failure.verdict}: {failure.message}); not the candidate's verdict"
        ),
    )


# What a candidate must not foresee: which rounds are checked and which call of a batch is kept. Not the
# benchmark's seeded generator, whose draws are the same in every run and can be worked out from the source.
_SECRET = random.SystemRandom()


def _checked_rounds() -> set[int]:
    """Early rounds after which the candidate's output is fetched: the first, and a few random ones of the
    first MIN_ROUNDS (every shape has that many); later rounds are drawn as they end (:func:`_is_checked`),
    and the very last call is fetched too."""
    return {0, *_SECRET.sample(range(1, MIN_ROUNDS), CHECKED_TIMED_CALLS - 2)}


def _is_checked(round_index: int, early: set[int]) -> bool:
    """Whether the round that just ended has its kept output fetched: one of ``early`` in the first MIN_ROUNDS,
    each later one with chance LATE_CHECK_RATE, drawn now and in secret."""
    if round_index < MIN_ROUNDS:
        return round_index in early
    return _SECRET.random() < LATE_CHECK_RATE


def check_timed_output(
    problem: Problem,
    shape: dict[str, int],
    distribution: str,
    reply: BaseModel,
    data: bytearray,
    kept: dict[int, dict[str, Any]],
    asked: TimedCall | None = None,
) -> CaseEvidence | None:
    """The output of a timed candidate call, against the reference of the inputs it read (CPU and CUDA alike).

    ``asked``: which call it must be and the inputs that call read, by the judge's own count (the CPU worker
    runs in the kernel's process, so what it says of its calls is the kernel's to change). None trusts the
    reply (the CUDA worker runs no candidate code on the host)."""
    if not isinstance(reply, p.Outputs) or reply.seed < 0:
        return CaseEvidence(
            phase="benchmark", check="timed_output", shape=shape, message="no timed candidate output came back"
        )
    if asked is not None:
        said = (reply.call, reply.seed, reply.bump, reply.position)
        if said != (asked.call, asked.seed, asked.bump, asked.position):
            return CaseEvidence(
                phase="benchmark",
                check="timed_output",
                shape=shape,
                message=(
                    f"a timed output came back as call {reply.call} (input seed {reply.seed}, drift {reply.bump} at "
                    f"element {reply.position}), but by the calls the judge asked for it is call {asked.call} "
                    f"(seed {asked.seed}, drift {asked.bump} at element {asked.position}): the calls the "
                    "harness counted in the kernel's process are not the calls it was asked to run"
                ),
            )
    generated = kept.get(reply.seed) or problem.make_inputs(shape, distribution, reply.seed)
    inputs = {name: value.copy() if isinstance(value, np.ndarray) else value for name, value in generated.items()}
    if asked is not None and asked.refreshes:
        # Replay the worker's refreshes of the pool (the fresh-input probe), in order, before the call's drift.
        refreshed = [q.name for q in p.varied(problem.params)]
        for seed in asked.refreshes:
            for index, name in enumerate(refreshed):
                flat = inputs[name].reshape(-1)
                p.apply_refresh(np, flat, p.refresh_factors(np, seed, index, flat.size, flat.dtype))
    bumped = next(iter(p.varied(problem.params)), None)
    if reply.bump >= 0 and bumped is not None:
        # Replay the worker's drift of one element (the same arithmetic; engine/harness/worker.py).
        flat = inputs[bumped.name].reshape(-1)
        if not 0 <= reply.position < flat.size or reply.bump >= p.BUMP_CYCLE:
            return CaseEvidence(
                phase="benchmark",
                check="timed_output",
                shape=shape,
                message=f"a timed call's inputs came back unknown (drift {reply.bump} at element {reply.position})",
            )
        flat[reply.position] = p.drift_value(flat[reply.position], p.drift_steps(np, flat.dtype)[reply.bump])
    try:
        reference = problem.reference(inputs, shape)
    except ProblemDefinitionError as error:
        varied = [q.name for q in p.varied(problem.params)]
        if not varied or (reply.bump < 0 and not (asked is not None and asked.refreshes)):
            raise
        # The inputs drawn were fine until the judge changed them (one element by up to 1/8, or every element by
        # 1/1024 in the fresh-input probe): say so, and how to keep an input as drawn, instead of sending the
        # user to a make_inputs that is right.
        raise ProblemDefinitionError(
            f"{error}; these were inputs the judge varied between timed calls ({', '.join(varied)}: "
            "docs/problems.md, 'Inputs the judge varies'): if a small change can take one out of the values your "
            "reference accepts, mark it {'vary': False} in PARAMS",
            hung=error.hung,
        ) from None
    offset = 0
    got: dict[str, np.ndarray] = {}
    for spec in reply.arrays:
        got[spec.name] = np.frombuffer(
            data, dtype=spec.dtype, count=spec.nbytes // np.dtype(spec.dtype).itemsize, offset=offset
        ).reshape(spec.dims)
        offset += spec.nbytes
    tolerances = {q.name: problem.tolerance(q.dtype, shape, inputs) for q in problem.outputs}
    constant = constant_answer([(reference[q.name], *tolerances[q.name]) for q in problem.outputs])
    if constant is not None:
        # The problem's error, as a tolerance that accepts zeros is: every timed check would pass a kernel that
        # writes these values without reading its inputs, and the speedup timed would be that of a memset.
        written = ", ".join(f"{q.name} {value:.6g}" for q, value in zip(problem.outputs, constant, strict=True))
        raise ProblemDefinitionError(
            f"{problem.folder / 'problem.py'}: every answer of a timed call at the benchmark shape {shape} is one "
            f"value within its tolerance ({written}) on the '{distribution}' inputs the judge times, so a kernel "
            "that writes it without reading its inputs passes every timed check: make the distribution the judge "
            "times ('normal' if DISTRIBUTIONS has it, else the first) one whose answers vary"
        )
    for q in problem.outputs:
        array = got.get(q.name)
        if array is None or array.shape != q.dims(shape) or array.dtype != np.dtype(DTYPES[q.dtype]):
            return CaseEvidence(
                phase="benchmark",
                check="timed_output",
                shape=shape,
                output=q.name,
                message=f"the output {q.name} of a timed call did not come back intact",
            )
        atol, rtol = tolerances[q.name]
        values, expected = output_values(problem, q.name, array, reference[q.name])
        largest = accepts_zeros(expected, atol, rtol)
        if largest is not None:
            # The problem's error, never the kernel's verdict: a tolerance loose only on the timed shapes (where
            # validation never compares) would let a kernel that writes nothing there be timed and promoted.
            raise ProblemDefinitionError(
                f"{problem.folder / 'problem.py'}: the tolerance of {q.name} at the benchmark shape {shape} "
                f"(atol {atol:g}, rtol {rtol:g}) accepts an all-zero output (the largest |reference| there is "
                f"{largest:.3g}); make "
                "tolerance_for() or TOLERANCES as tight on the benchmark shapes as on the validation ones"
            )
        passed, fields = compare_output(q.name, values, expected, atol, rtol)
        if not passed:
            fields["message"] = "during timing: " + fields["message"]
            return CaseEvidence(
                phase="benchmark",
                check="timed_output",
                shape=shape,
                seed=reply.seed,
                distribution=distribution,
                **fields,
            )
    return None


def _reports(
    problem: Problem,
    shapes: list[tuple[dict[str, int], float]],
    pools: list[int],
    samples: list[np.ndarray],
    references: Sequence[Reference],
    limits_hw: MachineLimits,
    threads: int,
    revalidated: bool,
    common: dict[str, Any],
    seed: int,
    confidence: float,
    noise_floor: float,
) -> list[BenchmarkReport]:
    weights = [w for _, w in shapes]
    bounds = [
        roofline_ns(problem, shape, limits_hw, pool, threads) for (shape, _), pool in zip(shapes, pools, strict=True)
    ]
    candidate_medians = [float(np.median(s[:, 0])) for s in samples]
    fraction = weighted_geomean([b / max(c, 1e-9) for b, c in zip(bounds, candidate_medians, strict=True)], weights)
    impossible = [
        (shape, median, bound, pool)
        for (shape, _), median, bound, pool in zip(shapes, candidate_medians, bounds, pools, strict=True)
        if median * ROOFLINE_SAFETY < bound
    ]
    for shape, _, bound, _ in impossible:
        s = samples[[sh for sh, _ in shapes].index(shape)]
        for j, reference in enumerate(references):
            numpy_ns = float(np.median(s[:, j + 1]))
            if reference.kind == "numpy" and numpy_ns * ROOFLINE_SAFETY < bound:
                # problem.py's own baseline beats the bound as well: the model is wrong, not the kernel's timing.
                model = problem.roofline(shape)
                raise ProblemDefinitionError(
                    f"{problem.folder / 'problem.py'}: roofline({shape}) gives {model['bytes']} bytes and "
                    f"{model['flops']} flops, at least {bound:.0f} ns on this machine, but numpy's baseline took "
                    f"{numpy_ns:.0f} ns: more than {ROOFLINE_SAFETY:g}x faster than the model allows, so no kernel "
                    "could be judged; make roofline() count the bytes each call must move (each input read once, "
                    "each output written once) and the flops it must do"
                )
    reports = []
    for j, reference in enumerate(references):
        pairs = [(s[:, j + 1], s[:, 0]) for s in samples]
        total, per_shape = speedup_with_intervals(
            pairs, weights, seed=seed, confidence=confidence, noise_floor=noise_floor
        )
        timings = [
            ShapeTiming(
                shape=shape,
                weight=weight,
                candidate_ns=float(np.median(s[:, 0])),
                reference_ns=float(np.median(s[:, j + 1])),
                ratio=estimate.ratio,
                ci_low=estimate.ci_low,
                ci_high=estimate.ci_high,
                samples=int(s.shape[0]),
                roofline_ns=bound,
                roofline_gbs=roofline_bandwidth_gbs(limits_hw, pool) * threads,
            )
            for (shape, weight), s, estimate, bound, pool in zip(shapes, samples, per_shape, bounds, pools, strict=True)
        ]
        verdict, cases, message = (
            Verdict.ok,
            [],
            (
                f"{total.ratio:.3f}x vs {reference.label} [{total.ci_low:.3f}, {total.ci_high:.3f}], "
                f"{fraction:.0%} of the roofline"
            ),
        )
        if impossible:
            shape, median, bound, pool = impossible[0]
            verdict = Verdict.impossible
            gbs = roofline_bandwidth_gbs(limits_hw, pool) * threads
            message = (
                f"measured {median:.0f} ns per call on {shape}, but moving its bytes and doing its flops takes "
                f"at least {bound:.0f} ns on this machine (bandwidth {gbs:.1f} GB/s, "
                f"peak {limits_hw.peak_gflops:.1f} GFLOP/s): more than {ROOFLINE_SAFETY:g}x faster than "
                "physically possible, so the timing cannot be trusted"
            )
            cases = [CaseEvidence(phase="benchmark", check="roofline", shape=shape, message=message)]
        reports.append(
            BenchmarkReport(
                verdict=verdict,
                reference=reference.label,
                speedup=total.ratio,
                ci_low=total.ci_low,
                ci_high=total.ci_high,
                shapes=timings,
                revalidated=revalidated,
                cases=cases,
                message=message,
                roofline_fraction=fraction if math.isfinite(fraction) else None,
                **common,
            )
        )
    return reports
