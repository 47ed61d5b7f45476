"""Recording a landscape: every setting of a problem's template space (or a seeded sample of it) compiled,
validated and timed against numpy a few times on this machine, each outcome appended to the event log
(engine/replay/landscape.py says how it is kept and resumed).

Timing is the slow part, and on a shared machine most of a short benchmark's wall time is not the timing:
the wait for a free core, the sandboxed workers starting, the input pools being generated. So the settings
are timed in groups: one interleaved benchmark times a group's first setting against numpy and against
every other setting of the group, all contenders in the same rounds on the same core (the budget grows
with the group, so each contender gets the timing a candidate-against-numpy benchmark of ``budget_s``
would). A setting k's speedup over numpy is then S₀ / R_k, with S₀ the first setting's speedup over numpy
and R_k its speedup over k; its interval adds S₀'s and R_k's half-widths in quadrature in log space (an
approximation: both share the first setting's samples). Each repeat times the group again with another
setting first. A group whose benchmark fails is timed one setting at a time, so a failure is the failing
setting's alone.

Validation runs with one seed per shape and distribution (a search runs three): a landscape needs each
setting's verdict, and template settings fail on every input or on none.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.evidence.store import EventStore
from engine.harness.backend import Backend, backend_for
from engine.harness.benchmarking import Reference
from engine.harness.verdicts import BenchmarkReport, Verdict, measurement_method
from engine.problems import Problem, load_problem
from engine.proposers.random_template import template_candidate, template_space
from engine.replay.landscape import (
    SEED_KEY,
    Landscape,
    LandscapeMeasured,
    LandscapeRecorded,
    LandscapeSample,
    measured_event,
    recorded_event,
    recording_id,
    sample_of,
    setting_key,
    stored_recordings,
)
from engine.search.candidates import Candidate

DEFAULT_BUDGET_S = 0.2
"""Timing budget per setting and repeat: short, since a landscape has hundreds of settings."""

DEFAULT_REPEATS = 4
"""Benchmarks per ok setting: a replayed evaluation draws one of them, and a setting's value on the landscape
is their geometric mean. Four rather than two: on this machine two readings of one kda setting could differ by
20% (6.59x and 8.05x), and the highest mean of two readings among 96 settings, the score's 1, was a lucky one.
Recorded again with four, that setting read at most 0.87 of the new optimum, and the search proposer's score at
budget 16 went from 0.25-0.40 to 0.68 (rmsnorm: 0.41-0.58 to 0.73). On the seven landscapes recorded with four,
a setting's fastest reading is 1.02-1.05 times its slowest (median over the settings). A recording takes twice
as long: 9-19 minutes per problem of 128 settings on the 2-core development machine."""

DEFAULT_GROUP = 8
"""Settings timed together in one interleaved benchmark (with numpy: nine contenders)."""

VALIDATION_SEEDS = 1
"""Seeds per validation shape and distribution."""

BUSY_RETRIES = 2
"""Times a group's benchmark that shared its cores with other work (a busy machine, BenchmarkReport.shared_cores)
is timed again, after BUSY_WAIT_S, before its samples are kept marked busy: a landscape is read once and replayed
thousands of times, so one busy reading of its optimum would move every score computed from it."""

BUSY_WAIT_S = 2.0
"""Seconds the recording waits before timing a busy group again."""


@dataclass(frozen=True)
class RecordingPlan:
    """What to record: the problem on the target, which settings, how often and how long each."""

    problem: str
    """The problem's name or folder."""
    target: str = "cpu"
    """``cpu`` (this machine's CPU target) or a resolved CPU target."""
    max_settings: int | None = None
    """Cap on the settings recorded (a seeded sample); None: the whole space."""
    sample_seed: int = 0
    """Seed of that sample."""
    repeats: int = DEFAULT_REPEATS
    """Benchmarks per ok setting."""
    budget_s: float = DEFAULT_BUDGET_S
    """Timing budget per setting and repeat."""
    group: int = DEFAULT_GROUP
    """Settings timed together."""
    force: bool = False
    """Record a new take even when a complete recording of this problem definition exists."""


@dataclass(frozen=True)
class _Item:
    key: str
    params: dict[str, Any]
    candidate: Candidate


async def record_landscape(
    store: EventStore,
    plan: RecordingPlan,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Landscape:
    """The complete landscape of ``plan``: the newest recording of the problem's current definition from the
    log, or (none there, or ``plan.force``) a new one measured now, resuming a take that stopped half-way."""
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    backend = backend_for(plan.target)
    problem = backend.problem(load_problem(plan.problem))
    fingerprint = problem.fingerprint()
    stored = await stored_recordings(store, problem.name, backend.target)
    space = {setting_key(params): params for params in template_space(problem)}
    chosen = sample_of(list(space), plan.max_settings, plan.sample_seed)
    method = measurement_method(backend.target)
    existing = stored.latest(fingerprint, at_least=len(chosen), method=method)
    if existing is not None and not plan.force:
        return existing
    recording = recording_id(
        fingerprint, len(space), plan.max_settings, plan.sample_seed, method, stored.takes(fingerprint)
    )
    done = stored.measured_in(recording)
    items = [_Item(SEED_KEY, {}, _seed_candidate(problem))] + [
        _Item(k, space[k], template_candidate(problem, space[k], None, proposer="landscape")) for k in chosen
    ]
    items_by_key = {item.key: item for item in items}
    # Shuffled, so a timing group mixes settings from all over the space.
    todo = [items_by_key[k] for k in shuffled([i.key for i in items if i.key not in done], plan.sample_seed)]
    say(
        f"recording {problem.name} on {backend.target}: {len(chosen)} of {len(space)} settings and the seed, "
        f"{len(todo)} left to measure ({recording})"
    )
    started = time.perf_counter()
    common = {"recording": recording, "problem": problem.name, "target": backend.target, "fingerprint": fingerprint}
    measured = 0
    for chunk in _chunks(todo, plan.group):
        payloads = _measure_chunk(backend, problem, chunk, plan, common, cache_dir, say)
        await store.append(f"landscape-{problem.name}-{backend.target}", [measured_event(p) for p in payloads])
        measured += len(chunk)
        elapsed = time.perf_counter() - started
        say(
            f"  {problem.name}: {measured}/{len(todo)} measured in {elapsed:.0f} s "
            f"({', '.join(f'{p.key}: {_describe(p)}' for p in payloads[:2])}, …)"
        )
    closing = LandscapeRecorded(
        **common,
        space_size=len(space),
        settings=len(chosen),
        max_settings=plan.max_settings,
        sample_seed=plan.sample_seed,
        repeats=plan.repeats,
        budget_s=plan.budget_s,
        seconds=time.perf_counter() - started,
        method=method,
    )
    await store.append(f"landscape-{problem.name}-{backend.target}", [recorded_event(closing)])
    landscape = (await stored_recordings(store, problem.name, backend.target)).latest(fingerprint, method=method)
    assert landscape is not None and landscape.recording == recording
    return landscape


def _seed_candidate(problem: Problem) -> Candidate:
    # The same candidate a search starts from (activities/search.py): the seed source with default flags.
    return Candidate.create(problem.seed_source(), None, label="seed", proposer="seed", tags=["seed"])


def _chunks(items: Sequence[_Item], size: int) -> list[list[_Item]]:
    return [list(items[i : i + size]) for i in range(0, len(items), max(1, size))]


def _describe(payload: LandscapeMeasured) -> str:
    if payload.verdict != "ok":
        return payload.verdict
    return "/".join(f"{s.speedup:.2f}" + ("(busy)" if s.busy else "") for s in payload.samples) + "x"


def _measure_chunk(
    backend: Backend,
    problem: Problem,
    chunk: list[_Item],
    plan: RecordingPlan,
    common: dict[str, Any],
    cache_dir: Path | None,
    say: Callable[[str], None],
) -> list[LandscapeMeasured]:
    """Compile and validate each setting of ``chunk``, then time the correct ones ``plan.repeats`` times (a timing
    that shared its cores again, up to BUSY_RETRIES times)."""
    results: dict[str, LandscapeMeasured] = {}
    artifacts: dict[str, str] = {}

    def failed(item: _Item, verdict: str, step: str, message: str) -> None:
        results[item.key] = LandscapeMeasured(
            **common,
            key=item.key,
            params=item.params,
            candidate_id=item.candidate.candidate_id,
            verdict=verdict,
            failed_step=step,
            message=" ".join(message.split())[:300],
            budget_s=plan.budget_s,
        )

    for item in chunk:
        compiled = backend.compile(problem, item.candidate.source, None, cache_dir=cache_dir)
        if compiled.verdict != Verdict.ok or compiled.artifact_id is None:
            failed(item, str(compiled.verdict), "compile", compiled.first_error or "")
            continue
        validation = backend.validate(problem, compiled.artifact_id, seeds=VALIDATION_SEEDS, cache_dir=cache_dir)
        if validation.verdict != Verdict.ok:
            failed(item, str(validation.verdict), "validate", validation.message)
            continue
        artifacts[item.key] = compiled.artifact_id
    timed = [item for item in chunk if item.key in artifacts]
    samples: dict[str, list[LandscapeSample]] = {item.key: [] for item in timed}
    for repeat in range(plan.repeats):
        if not timed:
            break
        # Another setting leads each repeat (the leader's samples anchor the others').
        order = timed[repeat % len(timed) :] + timed[: repeat % len(timed)]
        got = _time_group(backend, problem, [artifacts[i.key] for i in order], plan.budget_s, repeat, cache_dir)
        for _ in range(BUSY_RETRIES):
            if got is None or not any(sample.busy for sample in got):
                break
            say(f"  {problem.name}: a group's timing shared its cores with other work; timing it again")
            time.sleep(BUSY_WAIT_S)
            got = _time_group(backend, problem, [artifacts[i.key] for i in order], plan.budget_s, repeat, cache_dir)
        if got is None:
            # The group's benchmark failed: time each setting alone, so a failure is its own.
            for item in list(timed):
                (report,) = backend.benchmark(
                    problem,
                    artifacts[item.key],
                    [Reference(kind="numpy", label="numpy")],
                    budget_s=plan.budget_s,
                    seed=repeat,
                    cache_dir=cache_dir,
                )
                if report.verdict == Verdict.ok:
                    samples[item.key].append(
                        _sample(report.speedup, report.ci_low, report.ci_high, busy=report.shared_cores)
                    )
                else:
                    failed(item, str(report.verdict), "benchmark", report.message)
                    timed.remove(item)
            continue
        for item, sample in zip(order, got, strict=True):
            samples[item.key].append(sample)
    for item in timed:
        results[item.key] = LandscapeMeasured(
            **common,
            key=item.key,
            params=item.params,
            candidate_id=item.candidate.candidate_id,
            verdict="ok",
            samples=samples[item.key],
            budget_s=plan.budget_s,
            batch=len(timed),
        )
    return [results[item.key] for item in chunk]


def _time_group(
    backend: Backend,
    problem: Problem,
    artifact_ids: list[str],
    budget_s: float,
    seed: int,
    cache_dir: Path | None,
) -> list[LandscapeSample] | None:
    """Each artifact's speedup over numpy from one interleaved benchmark of all of them; None when it failed."""
    leader, others = artifact_ids[0], artifact_ids[1:]
    references = [Reference(kind="numpy", label="numpy")] + [
        Reference(kind="artifact", artifact_id=a, label=f"setting{i}") for i, a in enumerate(others, start=1)
    ]
    # Each contender gets about the timing a benchmark of two contenders with budget_s would give it.
    reports = backend.benchmark(
        problem, leader, references, budget_s=budget_s * (len(references) + 1) / 2, seed=seed, cache_dir=cache_dir
    )
    if any(r.verdict != Verdict.ok for r in reports):
        return None
    over_numpy = reports[0]
    # One benchmark timed them all: if it shared its cores, every sample it gave did.
    busy = any(r.shared_cores for r in reports)
    samples = [_sample(over_numpy.speedup, over_numpy.ci_low, over_numpy.ci_high, busy=busy)]
    for versus in reports[1:]:
        samples.append(_derived(over_numpy, versus, busy=busy))
    return samples


def _half_width(report: BenchmarkReport) -> float:
    return (math.log(max(report.ci_high, 1e-12)) - math.log(max(report.ci_low, 1e-12))) / 2


def _derived(over_numpy: BenchmarkReport, versus: BenchmarkReport, *, busy: bool) -> LandscapeSample:
    """Setting k over numpy from the leader over numpy (S₀) and the leader over k (R_k): S₀ / R_k."""
    centre = math.log(over_numpy.speedup) - math.log(versus.speedup)
    half = math.hypot(_half_width(over_numpy), _half_width(versus))
    return _sample(math.exp(centre), math.exp(centre - half), math.exp(centre + half), busy=busy)


def _sample(speedup: float, low: float, high: float, *, busy: bool) -> LandscapeSample:
    return LandscapeSample(speedup=float(speedup), ci_low=float(low), ci_high=float(high), busy=busy)


def shuffled(keys: Sequence[str], seed: int) -> list[str]:
    """``keys`` in a seeded random order."""
    rng = np.random.default_rng(seed)
    return [keys[int(i)] for i in rng.permutation(len(keys))]
