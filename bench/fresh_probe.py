"""The fresh-input probe: does it find kernels that reuse earlier calls' work, and only them, and what does it cost?

    .venv/bin/python bench/fresh_probe.py [--json] [--problems softmax,matmul,...] [--runs 2] [--budget-s 0.5]
        [--conditions quiet,spinning,bursts] [--no-cost]

After a shape's timed rounds the judge times the candidate on inputs no call has read (engine/harness/benchmarking.py
_fresh_probe): a kernel much slower there than in the rounds reused work, and is `impossible`. This prints:
- caught: the two kernels of tests/hostile/memoizes_changed_rows.c on matmul, timed against numpy: the memo
  (it keeps each input slot's answer and recomputes only the rows the drift changed) must be `impossible`, the
  same loops without it `ok` (their verdicts, speedups and the finding's message);
- false_findings, by condition: verdicts other than ok among the honest seed kernels of --problems, each timed
  --runs times against numpy, quiet, with a busy loop on every CPU, and with bursts of load on every CPU (three
  loops each busy for 0.1-0.6 s, then idle for 0.05-0.3 s, at random: the load that once covered all of an
  honest seed's probes and none of the reference's); the conditions (--conditions) take turns;
- cost_s, by problem: the median wall time of a benchmark with the probe less one without it (the same kernel,
  the two taking turns, quiet), with each side's runs: within the machine's run-to-run spread where it is cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine.harness.benchmarking as benchmarking  # after the path set-up
from engine.harness.benchmarking import Reference, benchmark_artifact
from engine.harness.cpu import compile_source
from engine.harness.machine import machine_limits
from engine.harness.noise import machine_noise_floor
from engine.problems import Problem, load_problem

ROOT = Path(__file__).resolve().parent.parent
MEMO = ROOT / "tests" / "hostile" / "memoizes_changed_rows.c"
# The loops end with the benchmark that started them (their parent), even one killed before it could stop them.
SPIN = """import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
parent = os.getppid()
while os.getppid() == parent:
    pass
"""
BURSTS = """import os, random, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
parent = os.getppid()
while os.getppid() == parent:
    until = time.monotonic() + random.uniform(0.1, 0.6)
    while time.monotonic() < until:
        pass
    time.sleep(random.uniform(0.05, 0.3))
"""
# Each condition's loop and how many of it run on every CPU: three bursty loops slow a kernel sharing their CPU
# about fourfold while they are busy, past the probe's factor of two (one busy loop halves its pace).
LOADS = {"quiet": (SPIN, 0), "spinning": (SPIN, 1), "bursts": (BURSTS, 3)}
DEFAULT_PROBLEMS = "softmax,rmsnorm,matmul,kda,layernorm,bias_gelu,l2norm,add_rmsnorm"


def _artifact(problem: Problem, source: str, cache: Path) -> str:
    compiled = compile_source(problem, source, cache_dir=cache)
    assert compiled.artifact_id is not None, compiled.first_error
    return compiled.artifact_id


def _timed(problem: Problem, artifact: str, cache: Path, budget_s: float, seed: int) -> tuple[Any, float]:
    started = time.perf_counter()
    (report,) = benchmark_artifact(
        problem, artifact, [Reference(kind="numpy", label="numpy")], budget_s=budget_s, seed=seed, cache_dir=cache
    )
    return report, time.perf_counter() - started


def main(args: argparse.Namespace) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix="kf-bench-fresh-"))
    # The machine's figures first, on a quiet machine: a calibration beside the busy loops would skew every run.
    machine_limits(1, cache)
    machine_noise_floor(1, cache)
    matmul = load_problem("matmul")
    caught = {}
    for label, source in (("memo", MEMO.read_text()), ("honest", "#define NOMEMO 1\n" + MEMO.read_text())):
        report, _ = _timed(matmul, _artifact(matmul, source, cache), cache, args.budget_s, 0)
        caught[label] = {"verdict": str(report.verdict), "speedup": report.speedup, "message": report.message}
        print(f"{label}: {report.verdict} {report.message}", file=sys.stderr, flush=True)

    problems = [load_problem(name) for name in args.problems.split(",")]
    seeds = {problem.name: _artifact(problem, problem.seed_source(), cache) for problem in problems}
    findings: dict[str, list[str]] = {condition: [] for condition in args.conditions.split(",")}
    counted = dict.fromkeys(findings, 0)
    for run in range(args.runs):
        for condition in findings:
            load, per_cpu = LOADS[condition]
            cpus = sorted(os.sched_getaffinity(0)) * per_cpu
            loops = [subprocess.Popen([sys.executable, "-c", load, str(cpu)]) for cpu in cpus]
            try:
                for problem in problems:
                    report, _ = _timed(problem, seeds[problem.name], cache, args.budget_s, run)
                    counted[condition] += 1
                    if str(report.verdict) != "ok":
                        findings[condition].append(f"{problem.name}: {report.verdict}: {report.message}")
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()
            print(f"run {run} {condition}: {len(findings[condition])} findings so far", file=sys.stderr, flush=True)

    probe = benchmarking._fresh_probe
    cost: dict[str, Any] = {}
    for problem in problems if args.cost else []:
        seconds: dict[str, list[float]] = {"with": [], "without": []}
        for run in range(args.runs + 1):
            for side in ("without", "with"):
                benchmarking._fresh_probe = probe if side == "with" else (lambda *_, **__: None)
                try:
                    _, elapsed = _timed(problem, seeds[problem.name], cache, args.budget_s, run)
                finally:
                    benchmarking._fresh_probe = probe
                seconds[side].append(round(elapsed, 2))
        added = statistics.median(seconds["with"]) - statistics.median(seconds["without"])
        cost[problem.name] = {"added": round(added, 2), **seconds}
        print(f"{problem.name}: {added:+.2f} s {seconds}", file=sys.stderr, flush=True)
    return {
        "caught": caught,
        "false_findings": {c: f"{len(found)} of {counted[c]}" for c, found in findings.items()},
        "false_finding_messages": [m for found in findings.values() for m in found],
        "cost_s": cost,
        "budget_s": args.budget_s,
        "command": "python bench/fresh_probe.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--problems", default=DEFAULT_PROBLEMS)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=0.5)
    parser.add_argument("--conditions", default=",".join(LOADS), help=f"of {', '.join(LOADS)}")
    parser.add_argument("--no-cost", dest="cost", action="store_false", help="skip the cost_s measurement")
    arguments = parser.parse_args()
    unknown = set(arguments.conditions.split(",")) - set(LOADS)
    if unknown:
        parser.error(f"--conditions: no condition {', '.join(sorted(unknown))}; choose from {', '.join(LOADS)}")
    result = main(arguments)
    if arguments.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
