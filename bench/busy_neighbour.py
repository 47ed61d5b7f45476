"""Busy neighbours: does the judge say when its reading was a busy machine's, and what does the neighbour do to it?

    .venv/bin/python bench/busy_neighbour.py [--json] [--problem softmax] [--runs 6] [--budget-s 0.5]

Times one kernel (the problem's seed against numpy, `benchmark_artifact` as a search's benchmark step calls it)
--runs times under each condition, the conditions taking turns run by run so a drift of the machine's load
reaches all of them:
- quiet: nothing started by this script;
- spinning: a busy loop pinned to every CPU, so the benchmark's leased core is shared with it;
- niced: the same busy loops at nice 19 (they yield to the benchmark's workers, and run whenever those wait
  between batches: what they leave in the caches and branch predictors is still there when the next batch runs);
- memory_next_door: a loop streaming a 256 MiB array, pinned to every CPU but the last (the one the benchmark
  leases first), so it shares the cache and memory bus and not the core (absent on a one-CPU machine).
Figures per condition: how many readings were flagged as a busy machine's (`shared_cores`), the median and range
of `foreign_cpu_share`, the median speedup over numpy relative to the quiet runs' median, and the median relative
half-width of the interval. engine/harness/contention.py says what the flag sees and what it cannot.
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

from engine.harness.benchmarking import Reference, benchmark_artifact  # after the path set-up
from engine.harness.cpu import compile_source
from engine.harness.machine import machine_limits
from engine.harness.noise import machine_noise_floor
from engine.problems import load_problem

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
STREAM = (
    "import os, sys\nimport numpy as np\nos.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "a = np.ones(1 << 26, dtype=np.float32)\nb = np.empty_like(a)\nwhile True: np.copyto(b, a)"
)


def _neighbours(condition: str) -> list[subprocess.Popen[bytes]]:
    cpus = sorted(os.sched_getaffinity(0))
    if condition == "quiet":
        return []
    if condition == "memory_next_door":
        return [subprocess.Popen([sys.executable, "-c", STREAM, str(cpu)]) for cpu in cpus[:-1]]
    nice = ["nice", "-n", "19"] if condition == "niced" else []
    return [subprocess.Popen([*nice, sys.executable, "-c", SPIN, str(cpu)]) for cpu in cpus]


def main(args: argparse.Namespace) -> dict[str, Any]:
    problem = load_problem(args.problem)
    cache = Path(tempfile.mkdtemp(prefix="kf-bench-busy-"))
    compiled = compile_source(problem, problem.seed_source(), cache_dir=cache)
    assert compiled.artifact_id is not None, compiled.first_error
    # The machine's figures first, on a quiet machine: a calibration beside a neighbour would skew every run.
    machine_limits(1, cache)
    machine_noise_floor(1, cache)
    conditions = ["quiet", "spinning", "niced"] + (["memory_next_door"] if len(os.sched_getaffinity(0)) > 1 else [])
    readings: dict[str, list[Any]] = {c: [] for c in conditions}
    load = os.getloadavg()[0]
    for run in range(args.runs):
        for condition in conditions:
            neighbours = _neighbours(condition)
            try:
                time.sleep(0.3 if neighbours else 0.0)  # the neighbours under way before the timing starts
                (report,) = benchmark_artifact(
                    problem,
                    compiled.artifact_id,
                    [Reference(kind="numpy", label="numpy")],
                    budget_s=args.budget_s,
                    seed=run,
                    cache_dir=cache,
                )
            finally:
                for neighbour in neighbours:
                    neighbour.kill()
                    neighbour.wait()
            readings[condition].append(report)
            print(
                f"run {run} {condition:16s} {report.speedup:6.3f}x [{report.ci_low:.3f}, {report.ci_high:.3f}] "
                f"foreign {report.foreign_cpu_share} busy {report.shared_cores}",
                file=sys.stderr,
                flush=True,
            )
    quiet = statistics.median(r.speedup for r in readings["quiet"])
    figures: dict[str, Any] = {}
    for condition, reports in readings.items():
        shares = [r.foreign_cpu_share for r in reports if r.foreign_cpu_share is not None]
        figures[condition] = {
            "flagged_busy": f"{sum(r.shared_cores for r in reports)} of {len(reports)}",
            "foreign_cpu_share_median": round(statistics.median(shares), 3) if shares else None,
            "foreign_cpu_share_range": [round(min(shares), 3), round(max(shares), 3)] if shares else None,
            "speedup_vs_quiet_median": round(statistics.median(r.speedup for r in reports) / quiet, 3),
            "speedup_vs_quiet_range": [
                round(min(r.speedup for r in reports) / quiet, 3),
                round(max(r.speedup for r in reports) / quiet, 3),
            ],
            "interval_halfwidth_median": round(
                statistics.median((r.ci_high - r.ci_low) / (2 * r.speedup) for r in reports), 4
            ),
        }
    figures["problem"] = problem.name
    figures["quiet_speedup_median"] = round(quiet, 3)
    figures["load_average_at_start"] = round(load, 2)
    figures["command"] = "python bench/busy_neighbour.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--problem", default="softmax")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--budget-s", type=float, default=0.5)
    arguments = parser.parse_args()
    result = main(arguments)
    if arguments.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
