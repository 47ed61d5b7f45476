"""Benchmarking: how much faster is a candidate than its reference points, on this noisy machine?

Everything runs in ONE sandboxed child, timed by the harness (``perf_counter_ns`` around each ctypes
call), never by the candidate:

1. per benchmark shape, a pool of input sets generated from recorded seeds (bigger than the last-level
   cache where the memory cap allows, so calls read memory rather than a warm cache) and a pool of output
   buffers whose period is coprime with it (a kernel that skips work on a pointer it has seen finds
   another input's answer in its output);
2. warm-up rounds, then timed rounds: candidate and every reference point once per round, in a fresh
   random order each round, until the shape's share of the time budget (in proportion to its weight) is
   spent; each reuse of an input set changes its first element slightly, so no input repeats exactly;
3. the outputs of the last timed candidate calls go back to the parent, which checks them against the
   reference computed from the same seeds (a kernel that is only wrong when timed is caught);
4. the candidate is validated again in the same process (a kernel that turns wrong after N calls is
   caught).

The parent computes per-shape paired median ratios and the weighted geometric mean with block-bootstrap
intervals (engine.harness.stats), and rejects a candidate measured faster than the roofline bound allows
(``impossible``): bytes moved / measured bandwidth or flops / measured peak, whichever is larger, with
a generous safety factor. Bandwidth and peak are measured once per machine and thread budget, in the
sandbox, and cached under the cache folder.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from engine import config
from engine.hardware import MachineLimits, hardware_fingerprint, hardware_key, llc_bytes
from engine.harness.sandbox import SandboxLimits
from engine.harness.stats import speedup_with_intervals
from engine.harness.validation import (
    DEFAULT_CALL_TIMEOUT_S,
    HarnessRun,
    TrialChecker,
    address_space_limit,
    compare_output,
    plan_trials,
    trial_seed,
    verdict_from_outcome,
    write_validation_phase,
)
from engine.harness.verdicts import BenchmarkReport, CaseEvidence, ShapeTiming, Verdict
from engine.problems import DTYPES, Problem

DEFAULT_BUDGET_S = 2.0
# A pool of inputs at least this many times the LLC, so most calls miss the cache ...
POOL_LLC_MULTIPLE = 1.5
# ... but never more memory than this, nor more slots than this.
MAX_POOL_BYTES = 256 << 20
MAX_POOL_SLOTS = 64
# A candidate must be more than this many times faster than the roofline bound to be called impossible.
# Generous on purpose: bandwidth and peak are measured with numpy and BLAS on a shared machine, which a
# hand-tuned kernel (non-temporal stores, data still in cache) can beat; the gaming this catches (work
# skipped on timed calls) is orders of magnitude below the bound, not a factor of two.
ROOFLINE_SAFETY = 8.0
CHECKED_TIMED_CALLS = 4
# How long a benchmark waits for CPUs no other sandbox on the machine holds before timing on shared ones.
EXCLUSIVE_WAIT_S = 120.0
# Must match child.BUMP_STEP: benchmark inputs drift by this much per use (see there).
BUMP_STEP = 1 / 64
# How many separately loaded copies of each artifact take turns in the timed calls. More than one would
# average code placement within a run, but splits the kernel's static state between copies (a kernel
# that turns wrong after N calls would get N × copies); one keeps the semantics of production.
LIBRARY_COPIES = 1


class Reference(BaseModel):
    """A reference point a candidate is timed against."""

    kind: Literal["numpy", "artifact"] = Field(description="numpy: the problem's baseline(); artifact: a library.")
    artifact_id: str | None = Field(default=None, description="The compiled library, for kind artifact.")
    label: str = Field(description="Name in reports, e.g. numpy, seed, incumbent.")


_limits_lock = threading.Lock()
_limits_memo: dict[str, MachineLimits] = {}


def machine_limits(threads: int = 1, cache_dir: Path | None = None, *, isolation: str = "auto") -> MachineLimits:
    """Measured bandwidth and peak for ``threads`` cores: once per process, cached on disk per hardware."""
    key = f"{hardware_key(hardware_fingerprint(threads))}-t{threads}"
    with _limits_lock:
        if key in _limits_memo:
            return _limits_memo[key]
        path = (cache_dir or config.cache_dir()) / "machine" / f"limits-{key}.json"
        if path.is_file():
            limits = MachineLimits.model_validate_json(path.read_text())
        else:
            limits = _calibrate(key, threads, cache_dir, isolation)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(limits.model_dump_json())
            tmp.replace(path)
        _limits_memo[key] = limits
        return limits


def _calibrate(key: str, threads: int, cache_dir: Path | None, isolation: str) -> MachineLimits:
    from engine.problems import load_problem

    # The harness needs a problem for its plan format; calibration touches none of it.
    problem = load_problem("softmax")
    results: dict[str, float] = {}

    def on_event(event: dict[str, Any]) -> str | None:
        if event.get("ev") == "calibration":
            results.update({k: float(v) for k, v in event.items() if k != "ev"})
        return None

    gemm_n = 1024 if threads == 1 else 2048
    with HarnessRun(
        problem, threads=threads, cache_dir=cache_dir, isolation=isolation, exclusive_wait_s=EXCLUSIVE_WAIT_S
    ) as run:
        plan = run.plan([], [{"kind": "calibrate", "gemm_n": gemm_n}], problem_py=False)
        limits = SandboxLimits(wall_seconds=300, cpu_seconds=600, address_space_bytes=4 << 30)
        run.run(plan, limits, on_event, call_timeout_s=300)
    if not results:
        raise RuntimeError(f"machine calibration failed: {run.state.problems or 'no result'}")
    return MachineLimits(
        key=key,
        threads=threads,
        dram_bandwidth_gbs=results["dram_bps"] / 1e9,
        cache_bandwidth_gbs=results["cache_bps"] / 1e9,
        peak_gflops=results["peak_flops"] / 1e9,
        llc_bytes=llc_bytes() or 32 << 20,
    )


def _bytes_of(problem: Problem, shape: dict[str, int], roles: Sequence[str]) -> int:
    return sum(
        int(np.prod(p.dims(shape), dtype=np.int64)) * np.dtype(DTYPES[p.dtype]).itemsize
        for p in problem.params
        if p.role in roles
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
    """Physical lower bound of one call: max(bytes / bandwidth, flops / peak), nanoseconds. The bandwidth
    is DRAM's when the pool exceeds the LLC, else the cache's; both scaled by the thread count."""
    model = problem.roofline(shape)
    gbs = limits.dram_bandwidth_gbs if pool_bytes > limits.llc_bytes else limits.cache_bandwidth_gbs
    bandwidth = gbs * threads  # generous: assume perfect scaling
    return max(float(model.get("bytes", 0)) / bandwidth, float(model.get("flops", 0)) / limits.peak_gflops)


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
) -> list[BenchmarkReport]:
    """Time the candidate against every reference point, interleaved in one sandboxed child; one report
    per reference, in order. ``budget_s`` is the timed time over all shapes (warm-up included)."""
    if not references:
        raise ValueError(
            "benchmark_artifact needs at least one reference point, e.g. Reference(kind='numpy', label='numpy')"
        )
    started = time.perf_counter()
    limits_hw = machine_limits(threads, cache_dir, isolation=isolation)
    fingerprint = hardware_fingerprint(threads).model_copy(
        update={"memory_bandwidth_gbs": limits_hw.dram_bandwidth_gbs, "peak_gflops": limits_hw.peak_gflops}
    )
    shapes = problem.benchmark_shapes
    distribution = "normal" if "normal" in problem.distributions else problem.distributions[0]
    with HarnessRun(
        problem, threads=threads, cache_dir=cache_dir, isolation=isolation, exclusive_wait_s=EXCLUSIVE_WAIT_S
    ) as run:
        contenders = [run.add_library("candidate", artifact_id, LIBRARY_COPIES)]
        for j, reference in enumerate(references):
            if reference.kind == "artifact":
                if not reference.artifact_id:
                    raise ValueError(f"reference {reference.label!r} is an artifact without an artifact_id")
                contenders.append(run.add_library(f"ref{j}", reference.artifact_id, LIBRARY_COPIES))
            else:
                contenders.append({"label": f"ref{j}", "kind": "numpy"})
        bench_shapes = []
        pools = []
        total_weight = sum(w for _, w in shapes)
        for s, (shape, weight) in enumerate(shapes):
            n_in, n_out, pool_bytes = pool_slots(problem, shape, limits_hw.llc_bytes)
            pools.append(pool_bytes)
            bench_shapes.append(
                {
                    "shape": shape,
                    "seeds": [trial_seed(seed, "benchmark", s, distribution, i) for i in range(n_in)],
                    "distribution": distribution,
                    # Time in proportion to weight: the heavier a shape counts, the more precisely it is timed.
                    "budget_s": budget_s * weight / total_weight,
                    "out_slots": n_out,
                    "check_slots": CHECKED_TIMED_CALLS,
                }
            )
        phases: list[dict[str, Any]] = [
            {
                "kind": "benchmark",
                "shapes": bench_shapes,
                "warmup_fraction": 0.1,
                "warmup_rounds": 3,
                "min_rounds": 10,
                "order_seed": seed,
            }
        ]
        trials = []
        kept: dict[str, dict[str, Any]] = {}
        if revalidate:
            groups = plan_trials(problem, "revalidation", 1, seed)
            trials = [t for g in groups for t in g]
            phases.append(write_validation_phase(problem, run.dir, "revalidation", groups, kept))
        plan = run.plan(contenders, phases, problem_py=True)
        limits = SandboxLimits(
            wall_seconds=240 + 3 * budget_s,
            cpu_seconds=int(300 + 3 * budget_s),
            address_space_bytes=address_space_limit(
                problem, [s for s, _ in shapes] + problem.validation_shapes, extra=2 * max(pools)
            ),
            file_size_bytes=max(
                64 << 20,
                2
                * max(
                    _bytes_of(problem, s, ("in", "out", "inout"))
                    for s, _ in shapes + [(v, 1.0) for v in problem.validation_shapes]
                ),
            ),
        )
        checker = TrialChecker(problem, run.dir, run.guard, trials, kept)
        failures: list[CaseEvidence] = []
        rounds: dict[int, int] = {}
        loops = {"timed_ns": 0, "loop_ns": 0}

        def on_event(event: dict[str, Any]) -> str | None:
            kind = event.get("ev")
            if kind == "done" and event.get("case") in checker.trials:
                evidence = checker.check(str(event["case"]))
            elif kind == "bench_done":
                index = int(event["index"])
                rounds[index] = int(event["rounds"])
                for key in loops:
                    loops[key] += int(event.get(key, 0))
                evidence = _check_timed_outputs(
                    problem, run.dir, index, shapes[index][0], distribution, event["checks"]
                )
            else:
                return None
            if evidence is not None:
                failures.append(evidence)
                return "stop: incorrect"
            return None

        outcome = run.run(plan, limits, on_event, call_timeout_s=call_timeout_s, poll_s=0.05)
        seconds = time.perf_counter() - started
        common = {
            "cpus_exclusive": run.sandbox.exclusive,
            "threads": threads,
            "hardware": fingerprint,
            "seconds": seconds,
            "timed_seconds": loops["timed_ns"] / 1e9,
            "loop_seconds": loops["loop_ns"] / 1e9,
        }
        labels = [r.label for r in references]

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
                    **common,
                )
                for label in labels
            ]

        if failures:
            return failed(Verdict.incorrect, failures[0])

        def where(check: str, message: str) -> CaseEvidence:
            trial = checker.trials.get(run.state.current or "")
            if trial is not None:
                return CaseEvidence(
                    phase=trial.phase,
                    check=check,
                    shape=trial.shape,
                    seed=trial.seed,
                    distribution=trial.distribution,
                    message=message,
                )
            index = run.state.bench_index
            shape = shapes[index][0] if index is not None and run.state.phase == "benchmark" else {}
            return CaseEvidence(phase=run.state.phase or "benchmark", check=check, shape=shape, message=message)

        broken = verdict_from_outcome(outcome, run.state, limits, where)
        if broken is not None:
            return failed(broken[0], broken[1])
        samples = [np.load(run.dir / f"bench{s}.npy") for s in range(len(shapes))]
    return _reports(problem, shapes, pools, samples, references, limits_hw, threads, revalidate, common, seed)


def _check_timed_outputs(
    problem: Problem,
    directory: Path,
    index: int,
    shape: dict[str, int],
    distribution: str,
    checks: list[dict[str, Any]],
) -> CaseEvidence | None:
    """The outputs the candidate produced in its last timed calls, against the reference of their inputs."""
    if not checks:
        return CaseEvidence(
            phase="benchmark",
            check="timed_output",
            shape=shape,
            message="no timed candidate output came back to be checked",
        )
    for j, check in enumerate(checks):
        inputs = problem.make_inputs(shape, distribution, int(check["seed"]))
        bump = int(check.get("bump", -1))
        bumped = next((p for p in problem.params if p.role != "out" and p.is_array and "float" in p.dtype), None)
        if bump >= 0 and bumped is not None:
            # Replay the child's change to the first element (same float32 arithmetic; child.py).
            array = inputs[bumped.name]
            array.reshape(-1)[0] = array.reshape(-1)[0] + np.float32((bump + 1) * BUMP_STEP)
        reference = problem.reference(inputs, shape)
        for p in problem.outputs:
            path = directory / f"bench{index}.check{j}.{p.name}.npy"
            try:
                got = np.load(path)
            except (OSError, ValueError):
                got = None
            if got is None or got.shape != p.dims(shape):
                return CaseEvidence(
                    phase="benchmark",
                    check="timed_output",
                    shape=shape,
                    output=p.name,
                    message=f"the output {p.name} of a timed call did not come back intact",
                )
            atol, rtol = problem.tolerance(p.dtype, shape, inputs)
            passed, fields = compare_output(p.name, got, reference[p.name], atol, rtol)
            if not passed:
                fields["message"] = "during timing: " + fields["message"]
                return CaseEvidence(
                    phase="benchmark",
                    check="timed_output",
                    shape=shape,
                    seed=int(check["seed"]),
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
) -> list[BenchmarkReport]:
    weights = [w for _, w in shapes]
    bounds = [
        roofline_ns(problem, shape, limits_hw, pool, threads) for (shape, _), pool in zip(shapes, pools, strict=True)
    ]
    candidate_medians = [float(np.median(s[:, 0])) for s in samples]
    impossible = [
        (shape, median, bound)
        for (shape, _), median, bound in zip(shapes, candidate_medians, bounds, strict=True)
        if median * ROOFLINE_SAFETY < bound
    ]
    reports = []
    for j, reference in enumerate(references):
        pairs = [(s[:, j + 1], s[:, 0]) for s in samples]
        total, per_shape = speedup_with_intervals(pairs, weights, seed=seed)
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
            )
            for (shape, weight), s, estimate, bound in zip(shapes, samples, per_shape, bounds, strict=True)
        ]
        verdict, cases, message = (
            Verdict.ok,
            [],
            (f"{total.ratio:.3f}x vs {reference.label} [{total.ci_low:.3f}, {total.ci_high:.3f}]"),
        )
        if impossible:
            shape, median, bound = impossible[0]
            verdict = Verdict.impossible
            message = (
                f"measured {median:.0f} ns per call on {shape}, but moving its bytes and doing its flops takes "
                f"at least {bound:.0f} ns on this machine (bandwidth {limits_hw.dram_bandwidth_gbs:.1f} GB/s, "
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
                **common,
            )
        )
    return reports
