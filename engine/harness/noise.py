"""How noisy is this machine from one run to the next? The run-level noise floor of benchmark intervals.

A benchmark's bootstrap (engine.harness.stats) resamples the rounds of ONE run, so it sees the noise within
that run only. Two runs of the same comparison differ by more than that: what else shares the memory bus
during a shape's window, where pages and code landed, the frequency the cores settled at. Each bootstrap
replicate therefore adds a run-level effect per shape, a normal draw with standard deviation ``floor`` on
the shape's log ratio. This module measures that floor on this machine instead of assuming one.

Measurement (A/A runs): the softmax and rmsnorm seed kernels, each timed against a second copy of itself
(:data:`RUNS_PER_PROBLEM` runs per problem, alternating problems so a change of load hits both, each with
a :data:`RUN_BUDGET_S` budget and no floor). The true ratio of every shape is 1, so the spread of a shape's
log ratio across runs is pure noise; what the bootstrap of each run already explains (its interval at
noise floor 0, turned into a standard deviation) is subtracted, and what remains is the floor.

Estimator (:func:`estimate_floor`), for shapes ``g`` with runs ``r``, log ratios ``x[g, r]`` and
within-run standard deviations ``w[g, r]``:

- pooled between-run variance ``S² = Σ_g Σ_r (x[g, r] - mean_r x[g, r])² / ν`` with ``ν = Σ_g (n_g - 1)``
  degrees of freedom, and pooled within-run variance ``B²`` (each shape's mean ``w²``, weighted by its
  ``n_g - 1``). Pooling over the 7 shapes of both problems gives 21 degrees of freedom from 8 runs, where
  one shape alone would have 3: a standard deviation from 4 runs lands anywhere between a third and 1.6
  times the true one (90% of calibrations), so one shape's figure, or the largest of seven, is a lottery;
- ``point = sqrt(max(0, S² - B²))``, the moment estimate of the run-level standard deviation;
- ``upper = sqrt(max(0, S² · ν / χ²(ν, 1 - level) - B²))``: ``S²`` replaced by its one-sided upper
  confidence bound at ``level`` (:data:`UPPER_BOUND_LEVEL`, 0.9; chi-square quantile by the Wilson-Hilferty
  approximation). With few runs the estimate errs towards wider intervals, i.e. towards coverage: at
  ν = 21 the between-run variance counts 1.6 times (at ν = 1000, 1.06 times);
- ``floor = upper`` bounded to [:data:`MIN_FLOOR`, :data:`MAX_FLOOR`]. Below, because a few quiet runs
  prove little about a busier hour; above, because a floor of several percent makes a 2% promotion margin
  unreachable and the search would stall without saying why: the floor is capped and the record says so
  in ``warning`` (the intervals are then too narrow for this machine: calibrate it when it is quieter, by
  deleting the cached file, or benchmark elsewhere).

Limits: the floor is estimated per shape (pooled), and the speedup's interval draws it once for all shapes
(engine.harness.stats: a contender's process serves every shape, so its run-level effect is common to them),
which over-covers where run effects are in fact independent per shape; and it is measured in one burst, so it
describes the load at calibration time (``load_average`` is recorded). On the 2-core development machine
(single-child harness) the bootstrap explained most of the A/A spread, quiet or with a memory-bound
neighbour on the other core: point estimates 0-0.009, a floor of 0.0145 at load 1.2, and with it 24 of
24 A/A intervals of bench/evaluation.py covered 1.0, median half-width 1.7%. With one worker per contender
(the parent's clock), calibrated at 2 s: point 0.027, floor 0.037; 24 of 24 covered at a median
half-width of 4.7% while the A/A point estimates spread by only 1.2% (log sd): the bound is conservative
here, over-covering (the batch bootstrap already carries most of the spread).

Cost: 8 benchmarks of 2 s, about 45 s of wall time on the development machine (sandbox start, input pools
and checks come on top of the budget), once per hardware fingerprint and thread budget; the result is
cached on disk under the cache folder (``machine/noise-<key>.json``) and in the process, like the
machine's limits (engine.harness.machine).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist

from pydantic import BaseModel, Field, ValidationError

from engine import config
from engine.hardware import hardware_fingerprint, hardware_key
from engine.harness.calibration_lock import calibration_lock

__all__ = ["NoiseFloor", "ShapeSpread", "estimate_floor", "machine_noise_floor"]

# The problems whose seed kernels are timed against themselves: 7 shapes between them, memory-bound
# (where run-to-run noise lives) and cheap to compile.
CALIBRATION_PROBLEMS = ("softmax", "rmsnorm")
RUNS_PER_PROBLEM = 4
# At the default benchmark budget: with less, each shape gets only the minimum rounds, its within-run spread
# is underestimated and the floor comes out too wide (0.5 s gave 0.044 and A/A half-widths of 5.4% at 2 s).
RUN_BUDGET_S = 2.0
# One-sided confidence of the upper bound on the pooled between-run variance (see the module docstring).
UPPER_BOUND_LEVEL = 0.9
# Each contender runs in a process of its own, and where a process's pages land moves its times by about 1%
# whatever the load (A/A point estimates spread 1.2%): a calibration in a quiet minute must not go below it.
MIN_FLOOR = 0.01
MAX_FLOOR = 0.05
# Names the estimator of a cached record; a record made by another one is measured again.
ESTIMATOR = "pooled-excess-variance-ub90/v3"


class ShapeSpread(BaseModel):
    """One benchmark shape's A/A log ratios across the calibration runs."""

    problem: str = Field(description="The problem whose seed kernel was timed against itself.")
    shape: dict[str, int] = Field(description="Problem sizes.")
    weight: float = Field(description="Weight of the shape in the problem's geometric mean.")
    log_ratios: list[float] = Field(description="log of the shape's A/A ratio, one per run (0 is no difference).")
    within_sd: list[float] = Field(
        description="Per run, the standard deviation of log_ratio that the run's own bootstrap shows (floor 0)."
    )
    spread: float = Field(description="Standard deviation of log_ratios across runs (n - 1 in the denominator).")
    excess: float = Field(
        description="sqrt(max(0, spread² - mean within_sd²)): this shape's run-level noise beyond the bootstrap."
    )


class NoiseFloor(BaseModel):
    """This machine's run-level noise floor for a thread budget, measured with A/A runs."""

    key: str = Field(description="Hardware key (model, ISA, cores, kernel) and thread budget: <hash>-t<threads>.")
    threads: int = Field(description="Thread budget the A/A runs were timed with.")
    floor: float = Field(
        description="Standard deviation of a shape's log ratio from run to run, beyond the bootstrap: the value "
        "benchmarks use (``upper`` bounded to [min_floor, max_floor])."
    )
    point: float = Field(description="Moment estimate of that standard deviation, from the pooled variances.")
    upper: float = Field(description="Its one-sided upper confidence bound at upper_bound_level, before bounds.")
    upper_bound_level: float = Field(description="Confidence level of ``upper``.")
    min_floor: float = Field(description="Lower bound applied to ``upper``.")
    max_floor: float = Field(description="Upper bound applied to ``upper``; see ``warning``.")
    degrees_of_freedom: int = Field(description="Pooled degrees of freedom: sum over shapes of (runs - 1).")
    runs: int = Field(description="A/A runs per problem.")
    budget_s: float = Field(description="Timing budget of each A/A run, seconds.")
    shapes: list[ShapeSpread] = Field(description="Per-shape log ratios and spreads the floor was derived from.")
    cpus_exclusive: bool = Field(
        description=(
            "False when another sandbox, or work from outside the benchmarks (a busy machine), shared the cores "
            "during some run."
        )
    )
    load_average: float = Field(description="One-minute load average of the machine when the measurement began.")
    measured_at: datetime = Field(description="When the measurement finished (UTC).")
    seconds: float = Field(description="Wall-clock seconds the measurement took, compiles included.")
    estimator: str = Field(description="Name and version of the estimator; records of another one are remeasured.")
    warning: str = Field(
        default="", description="Non-empty when the measured noise exceeded max_floor: intervals are too narrow."
    )


_floor_lock = threading.Lock()
_floor_memo: dict[str, NoiseFloor] = {}


@dataclass(frozen=True)
class FloorEstimate:
    """The floor derived from per-shape A/A log ratios; see :func:`estimate_floor`."""

    point: float
    upper: float
    floor: float
    degrees_of_freedom: int
    warning: str


def chi2_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of a chi-square distribution with ``df`` degrees of freedom (Wilson-Hilferty:
    within a few percent for df >= 3, which is all the estimator needs)."""
    z = NormalDist().inv_cdf(p)
    c = 2 / (9 * df)
    return df * max(1 - c + z * math.sqrt(c), 1e-3) ** 3


def estimate_floor(
    log_ratios: Sequence[Sequence[float]],
    within_sd: Sequence[Sequence[float]],
    *,
    level: float = UPPER_BOUND_LEVEL,
) -> FloorEstimate:
    """The run-level noise floor from A/A runs: ``log_ratios[g][r]`` is shape ``g``'s log ratio in run ``r``,
    ``within_sd[g][r]`` the standard deviation that run's bootstrap gives it. Pooled excess variance with a
    one-sided upper bound at ``level``, bounded to [MIN_FLOOR, MAX_FLOOR] (see the module docstring)."""
    if len(log_ratios) != len(within_sd):
        raise ValueError(f"need within-run deviations for every shape; got {len(log_ratios)} and {len(within_sd)}")
    between = within = 0.0
    df = 0
    for xs, ws in zip(log_ratios, within_sd, strict=True):
        if len(xs) != len(ws):
            raise ValueError(f"need one within-run deviation per run; got {len(xs)} runs and {len(ws)} deviations")
        n = len(xs)
        if n < 2:
            continue
        mean = sum(xs) / n
        between += sum((x - mean) ** 2 for x in xs)
        within += (n - 1) * sum(w * w for w in ws) / n
        df += n - 1
    if df == 0:
        raise ValueError("need at least one shape measured in two runs or more to estimate a run-to-run spread")
    s2, b2 = between / df, within / df
    point = math.sqrt(max(0.0, s2 - b2))
    upper = math.sqrt(max(0.0, s2 * df / chi2_quantile(1 - level, df) - b2))
    floor = min(max(upper, MIN_FLOOR), MAX_FLOOR)
    warning = ""
    if upper > MAX_FLOOR:
        warning = (
            f"run-to-run noise of {upper:.1%} per shape is above the {MAX_FLOOR:.0%} cap, so intervals are too "
            "narrow for this machine: calibrate again when it is quieter (delete the cached noise file) or "
            "benchmark on a quieter machine"
        )
    return FloorEstimate(point=point, upper=upper, floor=floor, degrees_of_freedom=df, warning=warning)


def machine_noise_floor(threads: int = 1, cache_dir: Path | None = None, *, isolation: str = "auto") -> NoiseFloor:
    """This machine's run-level noise floor for ``threads`` cores: measured with A/A runs once per hardware
    and thread budget (about 45 s), cached on disk and in the process (see the module docstring)."""
    key = f"{hardware_key(hardware_fingerprint(threads))}-t{threads}"
    with _floor_lock:
        if key in _floor_memo:
            return _floor_memo[key]
        path = config.machine_dir(cache_dir) / f"noise-{key}.json"
        noise = _read_cached(path, key)
        if noise is None:
            with calibration_lock(path):
                # Another process may have measured while this one waited for the lock.
                noise = _read_cached(path, key)
                if noise is None:
                    noise = _measure(key, threads, cache_dir, isolation)
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(noise.model_dump_json(indent=1))
                    tmp.replace(path)
        _floor_memo[key] = noise
        return noise


def _read_cached(path: Path, key: str) -> NoiseFloor | None:
    """The record at ``path`` if it is this machine's and made by this estimator; None means measure."""
    try:
        noise = NoiseFloor.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return None
    # A file copied from another machine (or an older estimator's) says nothing about this one.
    return noise if noise.key == key and noise.estimator == ESTIMATOR else None


def _measure(key: str, threads: int, cache_dir: Path | None, isolation: str) -> NoiseFloor:
    """A/A runs of the calibration problems' seed kernels, then :func:`estimate_floor`."""
    # Imported here: benchmark_artifact asks this module for the floor, and this module times with it; the
    # estimator above needs none of the sandbox machinery.
    from engine.harness.benchmarking import Reference, benchmark_artifact
    from engine.harness.cpu import compile_source
    from engine.harness.machine import CalibrationFailed
    from engine.harness.verdicts import Verdict
    from engine.problems import load_problem

    started = time.perf_counter()
    load = os.getloadavg()[0]
    problems = [load_problem(name) for name in CALIBRATION_PROBLEMS]
    seeds = []
    for problem in problems:
        compiled = compile_source(problem, problem.seed_source(), cache_dir=cache_dir)
        if compiled.verdict != Verdict.ok or compiled.artifact_id is None:
            raise CalibrationFailed(
                f"noise calibration failed: the {problem.name} seed kernel did not compile: {compiled.first_error}"
            )
        seeds.append(compiled.artifact_id)
    log_ratios: dict[tuple[int, int], list[float]] = {}
    within: dict[tuple[int, int], list[float]] = {}
    exclusive = True
    for run in range(RUNS_PER_PROBLEM):
        # Alternate problems, so a change of load during calibration reaches the shapes of both.
        for p, (problem, seed) in enumerate(zip(problems, seeds, strict=True)):
            (report,) = benchmark_artifact(
                problem,
                seed,
                [Reference(kind="artifact", artifact_id=seed, label="seed")],
                budget_s=RUN_BUDGET_S,
                threads=threads,
                seed=run,
                cache_dir=cache_dir,
                isolation=isolation,
                revalidate=False,
                noise_floor=0.0,
            )
            if report.verdict != Verdict.ok:
                raise CalibrationFailed(
                    f"noise calibration failed: the {problem.name} seed kernel against itself gave "
                    f"{report.verdict}: {report.message}"
                )
            exclusive = exclusive and not report.shared_cores
            # With noise floor 0 the interval is the bootstrap's alone; as a standard deviation:
            z = NormalDist().inv_cdf((1 + report.confidence) / 2)
            for s, timing in enumerate(report.shapes):
                log_ratios.setdefault((p, s), []).append(math.log(timing.ratio))
                within.setdefault((p, s), []).append((math.log(timing.ci_high) - math.log(timing.ci_low)) / (2 * z))
    groups = sorted(log_ratios)
    estimate = estimate_floor([log_ratios[g] for g in groups], [within[g] for g in groups])
    spreads = []
    for p, s in groups:
        xs, ws = log_ratios[(p, s)], within[(p, s)]
        mean = sum(xs) / len(xs)
        spread = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        shape, weight = problems[p].benchmark_shapes[s]
        spreads.append(
            ShapeSpread(
                problem=problems[p].name,
                shape=shape,
                weight=weight,
                log_ratios=xs,
                within_sd=ws,
                spread=spread,
                excess=math.sqrt(max(0.0, spread**2 - sum(w * w for w in ws) / len(ws))),
            )
        )
    return NoiseFloor(
        key=key,
        threads=threads,
        floor=estimate.floor,
        point=estimate.point,
        upper=estimate.upper,
        upper_bound_level=UPPER_BOUND_LEVEL,
        min_floor=MIN_FLOOR,
        max_floor=MAX_FLOOR,
        degrees_of_freedom=estimate.degrees_of_freedom,
        runs=RUNS_PER_PROBLEM,
        budget_s=RUN_BUDGET_S,
        shapes=spreads,
        cpus_exclusive=exclusive,
        load_average=load,
        measured_at=datetime.now(UTC),
        seconds=time.perf_counter() - started,
        estimator=ESTIMATOR,
        warning=estimate.warning,
    )
