"""Throughput, overhead and noise floor of the evaluation harness.

    .venv/bin/python bench/evaluation.py [--json] [--aa-runs 24] [--budget 2.0]

Measures, with the default budgets unless told otherwise, in a fresh cache folder:
- noise_floor: this machine's run-level noise floor (engine.harness.noise), measured first, in the fresh
  cache folder, so its A/A calibration runs count in no other figure; with how it was derived;
- candidates_per_min: distinct template instances of softmax and rmsnorm taken through compile + validate
  + benchmark (against numpy) back to back, per minute of wall-clock time; with the seconds per step;
- timing_overhead_share: the parent's pipe handshake as a fraction of the timed batches (the report's
  handshake_share), the largest over those throughput benchmarks;
- harness overhead: call_overhead_fraction -- the harness's cost around one timed call (an empty kernel
  with the problem's signature, timed the harness's way) over the seed kernel's median time per shape
  (the worst shape); wall_overhead_fraction -- a whole benchmark's wall time (sandbox start, input pools,
  checks of timed outputs, revalidation) beyond the timed calls, over the timed calls;
- intervals: repeated A/A runs (the seed kernel against itself, half softmax, half rmsnorm) with the
  measured noise floor: aa_coverage, the fraction of intervals (at the default confidence, 0.95) that
  contain 1.0 (target >= 0.95), and aa_halfwidth_median, the median relative half-width of those
  intervals (target <= 0.03);
- seed_speedup: each built-in problem's seed kernel against its numpy baseline, with the interval.
The machine is shared: its load average is printed too, and every figure moves with it.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.hardware import hardware_fingerprint, pinned_cpus
from engine.harness.benchmarking import DEFAULT_BUDGET_S, Reference, benchmark_artifact  # after the path set-up
from engine.harness.cpu import compile_source
from engine.harness.noise import machine_noise_floor
from engine.harness.sandbox import describe_isolation
from engine.harness.validation import validate_artifact
from engine.harness.verdicts import Verdict
from engine.problems import Problem, builtin_problems, load_problem


def instances(problem: Problem, count: int) -> list[str]:
    """``count`` distinct sources: template instances the problem allows (the seed when there are too few)."""
    space = problem.template_params
    sources: list[str] = []
    for values in itertools.product(*space.values()):
        params = dict(zip(space, values, strict=True))
        if problem.template_allows(params):
            sources.append(problem.render_template(params) + f"\n/* bench instance {len(sources)} */\n")
        if len(sources) == count:
            break
    return sources or [problem.seed_source()]


def throughput(cache: Path, per_problem: int, budget: float) -> dict[str, Any]:
    steps: dict[str, list[float]] = {"compile": [], "validate": [], "benchmark": []}
    verdicts = []
    handshake_shares: list[float] = []
    started = time.perf_counter()
    for name in ("softmax", "rmsnorm"):
        problem = load_problem(name)
        for source in instances(problem, per_problem):
            t0 = time.perf_counter()
            compiled = compile_source(problem, source, cache_dir=cache)
            steps["compile"].append(time.perf_counter() - t0)
            if compiled.verdict != Verdict.ok or compiled.artifact_id is None:
                verdicts.append(str(compiled.verdict))
                continue
            t0 = time.perf_counter()
            validation = validate_artifact(problem, compiled.artifact_id, cache_dir=cache)
            steps["validate"].append(time.perf_counter() - t0)
            if validation.verdict != Verdict.ok:
                verdicts.append(str(validation.verdict))
                continue
            t0 = time.perf_counter()
            (report,) = benchmark_artifact(
                problem,
                compiled.artifact_id,
                [Reference(kind="numpy", label="numpy")],
                budget_s=budget,
                cache_dir=cache,
            )
            steps["benchmark"].append(time.perf_counter() - t0)
            verdicts.append(str(report.verdict))
            share = getattr(report, "handshake_share", None)
            if share is not None:
                handshake_shares.append(float(share))
    elapsed = time.perf_counter() - started
    return {
        "candidates_per_min": len(verdicts) / elapsed * 60,
        "candidates": len(verdicts),
        "verdicts": verdicts,
        "seconds_per_step": {k: statistics.median(v) if v else None for k, v in steps.items()},
        "timing_overhead_share": max(handshake_shares, default=None),
    }


def empty_call_ns(problem: Problem, cache: Path) -> float:
    """Median cost of the harness's timed call around a kernel that does nothing (our own, so it is loaded
    here rather than in the sandbox), pinned to the CPU candidates use."""
    arrays = [p for p in problem.params if p.is_array]
    body = "".join(f"(void){p.name};" for p in problem.params)
    compiled = compile_source(problem, f"#include <stdint.h>\n{problem.signature} {{ {body} }}\n", cache_dir=cache)
    assert compiled.artifact_id is not None, compiled.first_error
    from engine.harness.cpu import artifact_path

    library = ctypes.CDLL(str(artifact_path(compiled.artifact_id, cache)))
    function = getattr(library, problem.entry)
    kinds = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int64": ctypes.c_int64, "int32": ctypes.c_int32}
    function.argtypes = [ctypes.c_void_p if p.is_array else kinds[p.dtype] for p in problem.params]
    function.restype = None
    args = [0 if p.is_array else kinds[p.dtype](1) for p in problem.params]
    del arrays
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(pinned_cpus(1)))
    try:
        perf = time.perf_counter_ns
        samples = []
        for _ in range(20000):
            t0 = perf()
            function(*args)
            samples.append(perf() - t0)
    finally:
        os.sched_setaffinity(0, before)
    return float(statistics.median(samples))


def overhead(cache: Path, budget: float) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name in ("softmax", "rmsnorm"):
        problem = load_problem(name)
        seed = compile_source(problem, problem.seed_source(), cache_dir=cache).artifact_id
        assert seed is not None
        (report,) = benchmark_artifact(
            problem, seed, [Reference(kind="numpy", label="numpy")], budget_s=budget, cache_dir=cache
        )
        empty = empty_call_ns(problem, cache)
        result[name] = {
            "empty_call_ns": empty,
            "call_overhead_fraction": max(empty / s.candidate_ns for s in report.shapes),
            "wall_overhead_fraction": report.seconds / report.timed_seconds - 1,
            "seconds": {"timed": report.timed_seconds, "wall": report.seconds},
        }
    return result


def aa_runs(cache: Path, runs: int, budget: float) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for run in range(runs):
        name = ("softmax", "rmsnorm")[run % 2]
        problem = load_problem(name)
        seed = compile_source(problem, problem.seed_source(), cache_dir=cache).artifact_id
        assert seed is not None
        itself = Reference(kind="artifact", artifact_id=seed, label="itself")
        # No noise_floor: the benchmark uses this machine's measured one, as every search benchmark does.
        (report,) = benchmark_artifact(problem, seed, [itself], budget_s=budget, cache_dir=cache, seed=1000 + run)
        rows.append(
            {
                "problem": name,
                "speedup": report.speedup,
                "ci_low": report.ci_low,
                "ci_high": report.ci_high,
                "confidence": report.confidence,
                "covers": report.ci_low <= 1.0 <= report.ci_high,
                "halfwidth": (report.ci_high - report.ci_low) / 2 / report.speedup,
            }
        )
        print(f"  A/A {run + 1}/{runs} {name}: {report.message}", file=sys.stderr, flush=True)
    return {
        "aa_runs": len(rows),
        "aa_confidence": sorted({r["confidence"] for r in rows}),
        "aa_coverage": sum(r["covers"] for r in rows) / len(rows),
        "aa_halfwidth_median": statistics.median(r["halfwidth"] for r in rows),
        "aa_speedup_range": [min(r["speedup"] for r in rows), max(r["speedup"] for r in rows)],
        "aa_detail": rows,
    }


def seed_speedups(cache: Path, budget: float) -> dict[str, Any]:
    speedups = {}
    for name in builtin_problems("cpu"):
        problem = load_problem(name)
        seed = compile_source(problem, problem.seed_source(), cache_dir=cache).artifact_id
        assert seed is not None
        (report,) = benchmark_artifact(
            problem, seed, [Reference(kind="numpy", label="numpy")], budget_s=budget, cache_dir=cache
        )
        speedups[name] = {
            "speedup": report.speedup,
            "ci_low": report.ci_low,
            "ci_high": report.ci_high,
            "verdict": str(report.verdict),
        }
    return speedups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--aa-runs", type=int, default=24, help="A/A runs (at least 20 for the coverage figure)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="benchmark budget in seconds")
    parser.add_argument("--candidates", type=int, default=4, help="distinct candidates per problem for throughput")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as folder:
        cache = Path(folder)
        figures: dict[str, Any] = {
            "load_average": os.getloadavg(),
            "isolation": describe_isolation(),
            "hardware": hardware_fingerprint().model_dump(mode="json"),
            "budget_s": args.budget,
        }
        noise = machine_noise_floor(cache_dir=cache)
        figures["noise_floor"] = noise.floor
        figures["noise_floor_detail"] = noise.model_dump(
            mode="json",
            include={"point", "upper", "degrees_of_freedom", "runs", "budget_s", "seconds", "load_average", "warning"},
        )
        print(f"  noise floor {noise.floor:.4f} (measured in {noise.seconds:.0f} s)", file=sys.stderr, flush=True)
        figures |= throughput(cache, args.candidates, args.budget)
        figures["overhead"] = overhead(cache, args.budget)
        figures |= aa_runs(cache, args.aa_runs, args.budget)
        figures["seed_speedup"] = seed_speedups(cache, args.budget)
        figures["load_average_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
