"""The CUDA judge: is a compiled kernel correct on the GPU (:func:`validate_cuda`), and how fast is it against
its reference points (:func:`benchmark_cuda`)?

Everything around the GPU is the CPU judge's, reused: the trials (fresh inputs per trial from recorded seeds,
every distribution, each shape's first trial repeated with another NaN pre-fill -- bitwise the same unless
the problem says DETERMINISTIC = False -- and once more with a few input elements changed), the comparison
to the float64 reference with the problem's tolerances, the guard and unchanged-input checks
(engine/harness/validation.py), the check of a timed call's output (engine/harness/benchmarking.py), the
fresh-input probe's rule (engine/harness/fresh_probe.py; here each probe is one round per input set no call has
read, after a shape's rounds, :func:`_fresh_probe`), the statistics (engine/harness/stats.py) and the
verdicts. What is the GPU's own lives beside this module: the
sandboxed child that owns the context (child.py, worker.py), the guarded device regions (layout.py), event
timing with L2 flushes and rotating buffers (timing.py), the measured HBM bandwidth (bandwidth.py) and the
per-GPU lock (lease.py).

A kernel's failure is a verdict in the report; the machine's failure is ``harness_error`` (no GPU, a child
that would not start, a reference that failed) or an exception (ArtifactNotFound: an artifact missing here;
GpuBusy: the GPU's lock stayed taken; SandboxFailure), never a kernel's verdict.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.hardware import GpuFingerprint, hardware_fingerprint
from engine.harness import protocol as p
from engine.harness.benchmarking import DEFAULT_BUDGET_S, Reference, check_timed_output
from engine.harness.cuda import messages as m
from engine.harness.cuda.bandwidth import COPY_REPEATS, cached_bandwidth, copy_bytes, hbm_roofline_ns, remember
from engine.harness.cuda.child import START_TIMEOUT_S, CudaChild, ModuleTrials, child_limits, shape_key
from engine.harness.cuda.device import DEFAULT_DRIVER
from engine.harness.cuda.inputs import InputCache, InputSets, input_sets, refreshed_sets
from engine.harness.cuda.layout import GPU_GUARD_BYTES, array_nbytes
from engine.harness.cuda.lease import GpuLease
from engine.harness.cuda.timing import RotationError, l2_flush_bytes, rotation_plan, rounds_per_batch
from engine.harness.driver import ArtifactNotFound, Failed
from engine.harness.fresh_probe import microseconds, probes_spread_s, reuse_seen
from engine.harness.protocol import ParamSpec
from engine.harness.stats import speedup_with_intervals, weighted_geomean
from engine.harness.validation import DEFAULT_CALL_TIMEOUT_S, TrialRunner, plan_trials, trial_seed
from engine.harness.verdicts import (
    CUDA_MEASUREMENT_METHOD,
    BenchmarkReport,
    CaseEvidence,
    ShapeTiming,
    ValidationReport,
    Verdict,
)
from engine.problems import Problem

__all__ = ["DEFAULT_GPU_NOISE_FLOOR", "benchmark_cuda", "validate_cuda"]

# Run-to-run standard deviation of a shape's log ratio beyond what the bootstrap of one run shows, on a GPU
# (engine/harness/stats.py). Event timing of flushed calls on a GPU held alone varies far less within a run
# than a shared CPU does; what varies between runs is the clock the GPU boosts to and its temperature, about
# a percent. Not yet measured per GPU the way engine/harness/noise.py measures a CPU's floor.
DEFAULT_GPU_NOISE_FLOOR = 0.01
# A candidate must beat bytes / measured HBM bandwidth by more than this factor to be called impossible. The
# bound is a device-to-device copy's; a kernel's writes can still sit in L2 when its end event fires (up to
# half of a copy's traffic), and a pure read stream runs a little faster than a copy: 3x leaves room for both
# and still catches a kernel that skips its work (orders of magnitude below the bound).
GPU_ROOFLINE_SAFETY = 3.0
# Warm-up calls per contender and shape (the first also compiles CuPy's kernels for the library).
WARM_CALLS = 5
MIN_ROUNDS = 10
MAX_ROUNDS = 20_000
# Host time between two queued calls (events, the flush's launch) assumed when sizing a batch.
QUEUE_GAP_NS = 20_000.0
# When the bandwidth is not yet known, the flush's duration is estimated at this rate (bytes per ns).
FALLBACK_BYTES_PER_NS = 1000.0
# Each batch's number of rounds is drawn in secret between half and all of the planned batch, and the
# candidate's output is fetched (and checked) once more after the batch that crosses a secret point of the
# shape's budget, between these shares of it. Why: the rounds of a batch were a fixed number and only the
# shape's very last call was checked, so a kernel that counted its launches knew which call the judge would
# look at, and one that watched the clock could do its work only near the end of the budget.
MID_CHECK_SPAN = (0.1, 0.9)
# Fetched outputs checked side by side (numpy's large operations let go of the GIL): a shape's mid-run check
# is under way while the GPU times the rest of it, and two references of 256 MiB shapes take seconds each.
CHECK_THREADS = 2
# Input sets of each fresh-input probe (the shape's own with every varied element changed, or new secret draws):
# every probe call is the first call of its contender on its set, so nothing of an earlier call can be reused. Two
# give the probe a median of two calls.
FRESH_SETS = 2
_SECRET = random.SystemRandom()
# The probe's sets are drawn once and never again: kept in no cache (the benchmark's own sets stay there).
_UNKEPT = InputCache(0)
LIBRARY_LABEL_NOTE = "the problem's library baseline (cuda_baseline, through CuPy)"


def _cuda_view(problem: Problem) -> Problem:
    """The problem as the CUDA backend sees it (its CUDA entry point and benchmark shapes)."""
    return problem.for_backend("cuda")


def _params(problem: Problem) -> list[ParamSpec]:
    return [
        ParamSpec(name=q.name, role=q.role, dtype=q.dtype, shape=list(q.shape), vary=q.vary) for q in problem.params
    ]


def _artifact(artifact_id: str, cache_dir: Path | None) -> Any:
    """The compiled kernel from this machine's cache; ArtifactNotFound (the machine's problem) otherwise."""
    from engine.harness.cuda.compile import load_cuda_artifact

    try:
        return load_cuda_artifact(artifact_id, cache_dir)
    except (FileNotFoundError, ValueError) as error:
        raise ArtifactNotFound(
            f"{error}; compile the source on this machine (engine.harness.cuda.compile.compile_cuda) or fetch it "
            "from the shared artifact store"
        ) from None


def _launches(artifact: Any, shapes: Sequence[dict[str, int]]) -> dict[str, m.LaunchDims]:
    """The artifact's launch for every shape, keyed by shape_key."""
    from engine.harness.cuda.launch import LaunchError

    launches = {}
    for shape in shapes:
        try:
            launch = artifact.launch.resolve(shape)
        except LaunchError as error:  # the compile step resolved these shapes: the problem changed since
            message = f"the artifact's launch does not resolve for {shape}: {error}"
            raise Failed(Verdict.harness_error, "launch", message) from None
        launches[shape_key(shape)] = m.LaunchDims(
            grid=tuple(launch.grid), block=tuple(launch.block), shared_bytes=int(launch.shared_bytes)
        )
    return launches


def _module(label: str, artifact: Any) -> tuple[m.ContenderSpec, bytes]:
    spec = m.ContenderSpec(label=label, kind="module", entry=artifact.entry, cubin_bytes=len(artifact.cubin))
    return spec, bytes(artifact.cubin)


# -- validation ------------------------------------------------------------------------------------------


def validate_cuda(
    problem: Problem,
    artifact_id: str,
    *,
    seeds: int = 3,
    seed: int = 0,
    cache_dir: Path | None = None,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    isolation: str = "auto",
    driver_module: str = DEFAULT_DRIVER,
) -> ValidationReport:
    """Run the compiled kernel on every validation shape × ``seeds`` seeds × distribution on the GPU, in a
    sandboxed child, and judge every trial here (see the module docstring). ``driver_module``: the CUDA
    driver API the child uses (cuda-python's; the CPU tests pass a double)."""
    started = time.perf_counter()
    problem = _cuda_view(problem)
    artifact = _artifact(artifact_id, cache_dir)
    groups = plan_trials(problem, "validation", seeds, seed, shifted=False)
    trials = sum(len(g) for g in groups)
    child: CudaChild | None = None
    runner: TrialRunner | None = None
    try:
        launches = _launches(artifact, problem.validation_shapes)
        with GpuLease(exclusive=False, cache_dir=cache_dir):
            child = CudaChild(
                [_module("candidate", artifact)],
                _params(problem),
                limits=child_limits(START_TIMEOUT_S + 3 * (trials + 2 * len(groups)) * call_timeout_s + 60),
                isolation=isolation,
                driver_module=driver_module,
            )
            runner = TrialRunner(problem, ModuleTrials(child, 0, launches), call_timeout_s, GPU_GUARD_BYTES)
            failure = runner.run(groups)
            try:
                child.close()
            except Failed:
                if failure is None:
                    raise  # it did not end as told after its last trial: that, not "ok", is the verdict
        common: dict[str, Any] = {
            "trials": runner.checker.checked,
            "output_tail": child.exited.output_tail[-2000:] if child.exited is not None else "",
            "isolation": child.isolation,
            "seconds": time.perf_counter() - started,
        }
        if failure is not None:
            return ValidationReport(verdict=Verdict.incorrect, cases=[failure], message=failure.message, **common)
        message = f"{runner.checker.checked} trials passed on the GPU"
        return ValidationReport(verdict=Verdict.ok, message=message, **common)
    except Failed as failed:
        evidence = (
            runner.where(failed.check, failed.message, "validation")
            if runner is not None
            else CaseEvidence(phase="validation", check=failed.check, message=failed.message)
        )
        return ValidationReport(
            verdict=failed.verdict,
            cases=[evidence],
            signal=failed.signal,
            message=failed.message,
            trials=runner.checker.checked if runner is not None else 0,
            output_tail=child.output_tail() if child is not None else "",
            isolation=child.isolation if child is not None else "",
            seconds=time.perf_counter() - started,
        )
    finally:
        if child is not None:
            child.discard()


# -- benchmark -------------------------------------------------------------------------------------------


def benchmark_cuda(
    problem: Problem,
    artifact_id: str,
    references: Sequence[Reference],
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    confidence: float = 0.95,
    seed: int = 0,
    cache_dir: Path | None = None,
    revalidate: bool = True,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    isolation: str = "auto",
    noise_floor: float | None = None,
    driver_module: str = DEFAULT_DRIVER,
    library_module: str = "cupy",
) -> list[BenchmarkReport]:
    """Time the kernel against every reference point on the GPU, interleaved in one sandboxed child, by CUDA
    events with the L2 flushed before every call; one report per reference, in order. A reference of kind
    ``artifact`` is another compiled CUDA kernel (the incumbent, the seed); any other kind (``numpy``) is the
    problem's library baseline, ``cuda_baseline`` through CuPy -- on a machine without CuPy its report says
    so (verdict harness_error: not a timing of anything). ``budget_s`` is the wall time over all shapes,
    warm-up included; ``noise_floor`` None is DEFAULT_GPU_NOISE_FLOOR. ``driver_module`` and ``library_module``:
    the CUDA driver API and the library the child uses (cuda-python's and CuPy; the CPU tests name doubles)."""
    if not references:
        raise ValueError(
            "benchmark_cuda needs at least one reference point, e.g. Reference(kind='numpy', label='library')"
        )
    started = time.perf_counter()
    problem = _cuda_view(problem)
    noise_floor = DEFAULT_GPU_NOISE_FLOOR if noise_floor is None else noise_floor
    artifact = _artifact(artifact_id, cache_dir)
    contenders = [_module("candidate", artifact)]
    artifacts = [artifact]
    columns: list[int] = []  # the contender each reference is
    library: int | None = None
    for reference in references:
        if reference.kind == "artifact":
            if not reference.artifact_id:
                raise ValueError(f"reference {reference.label!r} is an artifact without an artifact_id")
            other = _artifact(reference.artifact_id, cache_dir)
            columns.append(len(contenders))
            contenders.append(_module(reference.label, other))
            artifacts.append(other)
        else:
            if library is None:
                library = len(contenders)
                contenders.append((m.ContenderSpec(label=reference.label, kind="library"), b""))
            columns.append(library)
    fingerprint = hardware_fingerprint(1)
    state: dict[str, Any] = {"phase": "loading", "shape": {}}
    child: CudaChild | None = None
    runner: TrialRunner | None = None

    def failed(verdict: Verdict, evidence: CaseEvidence, gpu: GpuFingerprint | None = None) -> list[BenchmarkReport]:
        return [
            _report_without_timing(
                verdict,
                reference.label,
                evidence,
                fingerprint.model_copy(update={"gpu": gpu}),
                confidence,
                time.perf_counter() - started,
            )
            for reference in references
        ]

    try:
        shapes = problem.benchmark_shapes
        module_shapes = [s for s, _ in shapes] + problem.validation_shapes
        launches = [_launches(a, module_shapes) for a in artifacts]
        with (
            GpuLease(exclusive=True, cache_dir=cache_dir),
            ThreadPoolExecutor(CHECK_THREADS, "kf-output-check") as checker,
        ):
            child = CudaChild(
                contenders,
                _params(problem),
                limits=child_limits(START_TIMEOUT_S + 4 * budget_s + 600),
                problem_folder=problem.folder if library is not None else None,
                isolation=isolation,
                driver_module=driver_module,
                library_module=library_module,
            )
            gpu = child.ready.gpu
            bandwidth = _bandwidth(child, gpu, cache_dir)
            gpu = gpu.model_copy(update={"hbm_bandwidth_gbs": bandwidth})
            # Contenders not timed, and why: the library baseline where CuPy is missing or fails on its own.
            skipped = {i: child.ready.library for i, (spec, _) in enumerate(contenders) if spec.kind == "library"}
            skipped = {i: reason for i, reason in skipped.items() if reason}
            active = [i for i in range(len(contenders)) if i not in skipped]
            samples: list[np.ndarray] = []
            timed: list[list[int]] = []  # the contenders of each shape's columns
            reused: CaseEvidence | None = None  # the fresh-input probe's finding
            checks: list[Future[CaseEvidence | None]] = []

            def check_later(timed: TimedOutput) -> None:
                # The float64 reference of a large shape takes seconds: computed while the GPU times on.
                checks.append(checker.submit(timed.check, problem))

            for s, (shape, weight) in enumerate(shapes):
                state.update(phase="benchmark", shape=shape)
                budget_ns = budget_s * 1e9 * weight / sum(w for _, w in shapes)
                rows, reused = _time_shape(
                    problem,
                    child,
                    s,
                    shape,
                    launches,
                    active,
                    skipped,
                    contenders,
                    bandwidth,
                    budget_ns,
                    seed,
                    call_timeout_s,
                    check_later,
                )
                samples.append(rows)
                timed.append(list(active))
                if reused is not None:
                    break  # the candidate's timing is nobody's: the other shapes would not change that
            # A library baseline that failed on a later shape is left out of the earlier shapes' figures too.
            samples = [s[:, [cols.index(c) for c in active]] for s, cols in zip(samples, timed, strict=True)]
            revalidation: CaseEvidence | None = None
            if revalidate and reused is None:  # on the GPU, while the last shapes' outputs are checked here
                state.update(phase="revalidation", shape={})
                runner = TrialRunner(problem, ModuleTrials(child, 0, launches[0]), call_timeout_s, GPU_GUARD_BYTES)
                revalidation = runner.run(
                    plan_trials(problem, "revalidation", 3, seed, shifted=False), extra_checks=False
                )
            for check in checks:
                evidence = check.result()
                if evidence is not None:
                    return failed(Verdict.incorrect, evidence, gpu)
            if revalidation is not None:
                return failed(Verdict.incorrect, revalidation, gpu)
            if reused is not None:  # right answers, but timed doing less than their work
                return failed(Verdict.impossible, reused, gpu)
            revalidated = revalidate
            child.close()
    except RotationError as error:
        return failed(Verdict.harness_error, CaseEvidence(phase="benchmark", check="memory", message=str(error)))
    except Failed as failure:
        if failure.who != "candidate":
            # A reference point failed: the machine's problem (or the incumbent's), never the candidate's verdict.
            message = f"the reference point {failure.who!r} failed ({failure.verdict}: {failure.message})"
            return failed(Verdict.harness_error, CaseEvidence(phase="benchmark", check="reference", message=message))
        if runner is not None and state["phase"] == "revalidation":
            evidence = runner.where(failure.check, failure.message, "revalidation")
        else:
            evidence = CaseEvidence(
                phase=state["phase"], check=failure.check, shape=state["shape"], message=failure.message
            )
        return failed(failure.verdict, evidence)
    finally:
        if child is not None:
            child.discard()
    assert child is not None
    return _reports(
        problem,
        references,
        columns,
        active,
        samples,
        bandwidth,
        skipped,
        {
            "confidence": confidence,
            "threads": 1,
            # The GPU was held alone (lease.py); the host's cores do not enter an event-timed figure.
            "cpus_exclusive": True,
            "revalidated": revalidated,
            "method": CUDA_MEASUREMENT_METHOD,
            "hardware": fingerprint.model_copy(update={"gpu": gpu}),
            "timed_seconds": float(sum(s.sum() for s in samples)) / 1e9,
            "seconds": time.perf_counter() - started,
        },
        seed,
        noise_floor,
    )


def _bandwidth(child: CudaChild, gpu: GpuFingerprint, cache_dir: Path | None) -> float:
    """This GPU's HBM bandwidth, GB/s: cached per GPU kind, else measured now in the child."""
    record = cached_bandwidth(gpu, cache_dir)
    if record is None:
        nbytes = copy_bytes(gpu.l2_bytes, child.ready.free_bytes)
        reply, _ = child.request(
            m.MeasureBandwidth(nbytes=nbytes, repeats=COPY_REPEATS), timeout=300, what="measuring the HBM bandwidth"
        )
        if not isinstance(reply, m.BandwidthMeasured):
            raise Failed(Verdict.harness_error, "harness", f"the bandwidth measurement was answered with {reply.kind}")
        record = remember(gpu, reply, cache_dir)
    return record.bandwidth_gbs


@dataclass(frozen=True)
class TimedOutput:
    """One fetched output of the candidate's timed calls, with the inputs to check it against."""

    shape: dict[str, int]
    distribution: str
    output: m.Reply
    data: bytearray
    kept: dict[int, dict[str, Any]]

    def check(self, problem: Problem) -> CaseEvidence | None:
        """None when the timed output matches the reference of the inputs it read, else the evidence."""
        return check_timed_output(problem, self.shape, self.distribution, self.output, self.data, self.kept)


def _time_shape(
    problem: Problem,
    child: CudaChild,
    index: int,
    shape: dict[str, int],
    launches: list[dict[str, m.LaunchDims]],
    active: list[int],
    skipped: dict[int, str],
    contenders: list[tuple[m.ContenderSpec, bytes]],
    bandwidth_gbs: float,
    budget_ns: float,
    seed: int,
    call_timeout_s: float,
    check_later: Callable[[TimedOutput], None],
) -> tuple[np.ndarray, CaseEvidence | None]:
    """One shape's per-call device nanoseconds by round and active contender: input sets, warm-up of each
    contender alone, interleaved timed rounds, then the fresh-input probe (its finding, or None). The candidate's
    fetched outputs are handed to ``check_later`` as they come (the last call of a secretly chosen batch, the
    shape's last call and the probe's). A library baseline that fails in its warm-up leaves ``active`` for
    ``skipped``, with the reason."""
    gpu = child.ready.gpu
    flush = l2_flush_bytes(gpu.l2_bytes)
    in_bytes = sum(array_nbytes(q.dims(shape), q.dtype) for q in problem.params if q.role in ("in", "inout"))
    out_bytes = sum(array_nbytes(q.dims(shape), q.dtype) for q in problem.params if q.role in ("out", "inout"))
    modules = sum(1 for spec, _ in contenders if spec.kind == "module")
    rotation = rotation_plan(in_bytes, out_bytes, modules, child.ready.free_bytes, flush)
    distribution = problem.timed_distribution
    seeds = [trial_seed(seed, "benchmark", index, distribution, i) for i in range(rotation.in_slots)]
    key = shape_key(shape)
    module_launches: list[m.LaunchDims | None] = []
    k = 0
    for spec, _ in contenders:
        module_launches.append(launches[k][key] if spec.kind == "module" else None)
        k += spec.kind == "module"

    def prepare(seeds: list[int], out_slots: int, sets: InputSets, what: str = "taking the input sets") -> float:
        """The child given these input sets (the shape's buffers anew); the copy's timeout, seconds."""
        command = m.CudaPrepare(
            shape=shape,
            seeds=seeds,
            arrays=sets.arrays,
            scalars=sets.scalars,
            out_slots=out_slots,
            launches=module_launches,
            flush_bytes=flush,
            payload_bytes=sum(len(piece) for piece in sets.pieces),
        )
        copy_s = 60 + command.payload_bytes / 1e8
        child.request(command, *sets.pieces, timeout=copy_s, what=what)
        return copy_s

    sets = input_sets(problem, shape, distribution, seeds)
    copy_s = prepare(seeds, rotation.out_slots, sets)
    started = time.perf_counter_ns()
    per_call: dict[int, float] = {}
    for c in list(active):
        reply, _ = child.request(
            m.CudaWarm(contender=c, calls=WARM_CALLS), timeout=call_timeout_s * WARM_CALLS + 120, what="warm-up"
        )
        if isinstance(reply, m.LibraryUnusable):
            active.remove(c)
            skipped[c] = reply.reason
            continue
        if not isinstance(reply, m.CudaTimes):
            raise Failed(Verdict.harness_error, "harness", f"a warm-up was answered with {reply.kind}")
        per_call[c] = float(statistics.median(reply.ns[1:] or reply.ns))
    flush_ns = flush / (bandwidth_gbs if bandwidth_gbs > 0 else FALLBACK_BYTES_PER_NS)
    round_ns = sum(per_call.values()) + len(active) * (flush_ns + QUEUE_GAP_NS)
    batch = rounds_per_batch(round_ns)
    rows: list[list[float]] = []
    mid_checked = False
    mid_check_ns = _SECRET.uniform(*MID_CHECK_SPAN) * budget_ns
    fetching_ns = 0  # the mid-run fetch's copy is not the rounds' time
    while True:
        rounds = _SECRET.randint(max(1, batch // 2), batch)
        reply, _ = child.request(
            m.CudaRounds(contenders=active, rounds=rounds, first_round=len(rows)),
            timeout=call_timeout_s + 20 * rounds * round_ns / 1e9,
            what="timed rounds",
        )
        if not isinstance(reply, m.CudaTimings):
            raise Failed(Verdict.harness_error, "harness", f"timed rounds were answered with {reply.kind}")
        rows.extend(reply.ns)
        spent = time.perf_counter_ns() - started - fetching_ns
        if len(rows) >= MAX_ROUNDS or (len(rows) >= MIN_ROUNDS and spent >= budget_ns):
            break
        if not mid_checked and spent >= mid_check_ns:
            fetched = time.perf_counter_ns()
            output, data = child.request(m.CudaFetch(contender=0), timeout=copy_s, what="fetching a timed output")
            check_later(TimedOutput(shape, distribution, output, data, sets.kept))
            mid_checked = True
            fetching_ns += time.perf_counter_ns() - fetched
    output, data = child.request(m.CudaFetch(contender=0), timeout=copy_s, what="fetching the last timed output")
    check_later(TimedOutput(shape, distribution, output, data, sets.kept))
    timed = np.asarray(rows, dtype=np.float64)

    def probe(fresh: list[int]) -> np.ndarray:
        """Per-call nanoseconds of one round per fresh set (every call the first on its set), the candidate's
        last output handed to ``check_later``: a probe it recognised and skipped is wrong there. The sets are
        the shape's own with every varied input element changed a little (refreshed_sets), or, where the judge
        varies no input (integers only), new draws of the secret seeds ``fresh``."""
        if p.varied(problem.params):
            drawn = refreshed_sets(problem, sets, fresh, _SECRET.getrandbits(63))
        else:
            drawn = input_sets(problem, shape, distribution, fresh, _UNKEPT)
        probe_copy_s = prepare(fresh, len(fresh) + 1, drawn, "taking the fresh-input probe's sets")
        reply, _ = child.request(
            m.CudaRounds(contenders=active, rounds=len(fresh), first_round=0),
            timeout=call_timeout_s + 20 * len(fresh) * round_ns / 1e9,
            what="the fresh-input probe",
        )
        if not isinstance(reply, m.CudaTimings):
            raise Failed(Verdict.harness_error, "harness", f"the fresh-input probe was answered with {reply.kind}")
        output, data = child.request(
            m.CudaFetch(contender=0), timeout=probe_copy_s, what="fetching the fresh-input probe's output"
        )
        check_later(TimedOutput(shape, distribution, output, data, drawn.kept))
        return np.asarray(reply.ns, dtype=np.float64)

    return timed, _fresh_probe(shape, timed, probe)


def _fresh_probe(
    shape: dict[str, int], rows: np.ndarray, probe: Callable[[list[int]], np.ndarray]
) -> CaseEvidence | None:
    """The candidate timed on input sets no call has read, against its median in the rounds: the GPU's fresh-input
    probe (the CPU's: engine/harness/benchmarking.py _fresh_probe; the rule: engine/harness/fresh_probe.py).

    Why: the rounds cycle a few input sets, each use drifting one element, and a kernel may keep what it computed
    for each set in ``__device__`` memory (by pointer or by a cheap look at the content), find the element that
    changed by reading the inputs once, and patch its last answer: a matmul so timed reads O(n^2) and computes
    O(n) where its work is O(n^3), with every output right. Real inputs never repeat, so that speed is nobody's.
    An honest kernel is as fast on fresh sets (the L2 is flushed before every call either way); one that reused
    work is slower by what it skipped. Each probe is ``probe(labels)``: FRESH_SETS sets no call has read (labelled
    with secret numbers), one round per set over every active contender, so the first reference's calls on the
    same fresh sets say whether the device itself was slower (only a candidate slower than that explains, in every
    probe, is a finding)."""
    reference_ns = float(np.median(rows[:, 1])) if rows.shape[1] > 1 else None
    controls: dict[str, float] = {}

    def probe_candidate() -> float:
        ns = probe([_SECRET.getrandbits(63) for _ in range(FRESH_SETS)])
        if reference_ns is not None:
            controls["last"] = float(np.median(ns[:, 1])) / reference_ns
        return float(np.median(ns[:, 0])) / float(np.median(rows[:, 0]))

    pairs = reuse_seen(probe_candidate, (lambda: controls["last"]) if reference_ns is not None else None)
    if pairs is None:
        return None
    fastest = min(pairs, key=lambda pair: pair.candidate)
    timed_ns = float(np.median(rows[:, 0]))
    paces = [pair.reference for pair in pairs if pair.reference is not None]
    control = (
        f"; the reference, timed on the same fresh sets, ran at {min(paces):.1f}-{max(paces):.1f}x its own pace"
        if paces
        else ""
    )
    return CaseEvidence(
        phase="benchmark",
        check="fresh_inputs",
        shape=shape,
        message=(
            f"{fastest.candidate:.1f}x slower on input sets no call had read "
            f"({microseconds(fastest.candidate * timed_ns)} per call, the best of {len(pairs)} probes spread over "
            f"{probes_spread_s(len(pairs)):.1f} s) than in the timed rounds ({microseconds(timed_ns)}, their "
            f"median){control}: its timed calls did less than their work, reusing that of earlier calls on inputs "
            "it had seen, which real inputs never allow; compute each call's answer from its inputs"
        ),
    )


def _report_without_timing(
    verdict: Verdict,
    label: str,
    evidence: CaseEvidence,
    hardware: Any,
    confidence: float,
    seconds: float,
) -> BenchmarkReport:
    """The report of a reference that was not timed (a failure, or a library baseline this machine lacks)."""
    return BenchmarkReport(
        verdict=verdict,
        reference=label,
        speedup=0.0,
        ci_low=0.0,
        ci_high=0.0,
        confidence=confidence,
        cases=[evidence],
        message=evidence.message,
        hardware=hardware,
        method=CUDA_MEASUREMENT_METHOD,
        seconds=seconds,
    )


def _reports(
    problem: Problem,
    references: Sequence[Reference],
    columns: list[int],
    active: list[int],
    samples: list[np.ndarray],
    bandwidth_gbs: float,
    skipped: dict[int, str],
    common: dict[str, Any],
    seed: int,
    noise_floor: float,
) -> list[BenchmarkReport]:
    shapes = problem.benchmark_shapes
    weights = [w for _, w in shapes]
    bounds = [hbm_roofline_ns(problem.roofline(shape), bandwidth_gbs) for shape, _ in shapes]
    candidate = [float(np.median(s[:, 0])) for s in samples]
    fraction = weighted_geomean([max(b, 1e-9) / c for b, c in zip(bounds, candidate, strict=True)], weights)
    impossible = [
        (shape, median, bound)
        for (shape, _), median, bound in zip(shapes, candidate, bounds, strict=True)
        if median * GPU_ROOFLINE_SAFETY < bound
    ]
    reports = []
    for reference, column in zip(references, columns, strict=True):
        if column not in active:
            message = f"{reference.label}: {LIBRARY_LABEL_NOTE} was skipped: {skipped.get(column, 'not timed')}"
            evidence = CaseEvidence(phase="benchmark", check="reference", message=message)
            reports.append(
                _report_without_timing(
                    Verdict.harness_error,
                    reference.label,
                    evidence,
                    common["hardware"],
                    common["confidence"],
                    common["seconds"],
                )
            )
            continue
        k = active.index(column)
        pairs = [(s[:, k], s[:, 0]) for s in samples]
        total, per_shape = speedup_with_intervals(
            pairs, weights, seed=seed, confidence=common["confidence"], noise_floor=noise_floor
        )
        timings = [
            ShapeTiming(
                shape=shape,
                weight=weight,
                candidate_ns=float(np.median(s[:, 0])),
                reference_ns=float(np.median(s[:, k])),
                ratio=estimate.ratio,
                ci_low=estimate.ci_low,
                ci_high=estimate.ci_high,
                samples=int(s.shape[0]),
                roofline_ns=bound,
            )
            for (shape, weight), s, estimate, bound in zip(shapes, samples, per_shape, bounds, strict=True)
        ]
        verdict, cases = Verdict.ok, []
        message = (
            f"{total.ratio:.3f}x vs {reference.label} [{total.ci_low:.3f}, {total.ci_high:.3f}], "
            f"{fraction:.0%} of the HBM roofline"
        )
        if impossible:
            shape, median, bound = impossible[0]
            verdict = Verdict.impossible
            message = (
                f"measured {median:.0f} ns per call on {shape}, but moving its bytes takes at least {bound:.0f} ns "
                f"at this GPU's measured {bandwidth_gbs:.0f} GB/s: more than {GPU_ROOFLINE_SAFETY:g}x faster than "
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
                cases=cases,
                message=message,
                roofline_fraction=fraction if math.isfinite(fraction) else None,
                **common,
            )
        )
    return reports
