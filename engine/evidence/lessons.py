"""Lessons: what the evidence says about each change for one problem on one target, as people and
proposers use it.

``lessons_for(store, problem, target)`` catches the lessons projection up (engine/evidence/lessons_projection.py)
and reads its rows for the problem's whole family on that target. Evidence on the problem itself counts
fully; evidence on the other problems of its family counts FAMILY_WEIGHT as much, and at most
FAMILY_MAX_WEIGHT candidates' worth per change (transfer: rmsnorm may learn from softmax through shared
parameter names such as ``SIMD=1``, as a hint that its own evidence soon outweighs). It returns:

- ``summary``: at most SUMMARY_LINES lines for prompts and people, whatever the size of the history;
- ``priors``: per change, Beta posteriors (correct, beats its parent) and the mean and variance of the
  log-speedup over the parent and of the log-advantage (how much faster, in ln, candidates carrying the
  change ran than the average candidate of their problem) — what the search proposer samples from;
- ``settings``: the measured template settings of the family on the target, with the mean and variance of
  their log-speedups over numpy, from which the search proposer fits a model with interaction effects;
- ``changes``, ``failures``, ``dead_ends``: the structured rows behind the summary.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Literal

import asyncpg
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engine.errors import UserError
from engine.evidence.lessons_projection import ALL, PROJECTION, catch_up_lessons, params_of
from engine.evidence.projections import checkpoint_of
from engine.evidence.store import EventStore
from engine.harness.verdicts import LEGACY_METHOD

FAMILY_WEIGHT = 0.5
"""How much a candidate of another problem of the family counts, relative to one of the problem itself."""

FAMILY_MAX_WEIGHT = 3.0
"""Most weight the other problems of the family carry for one change, however much they tried it: what
held on softmax is a hint for rmsnorm, never a certainty its own few measurements cannot overturn."""

DEAD_END_ATTEMPTS = 3
"""A change that never compiled (or was never correct) in this many attempts is a dead end."""

SUMMARY_LINES = 15
"""Most lines of a summary."""

MAX_CHANGES = 64
"""Most changes listed in ``Lessons.changes`` and ``Lessons.priors`` (those with the most evidence)."""

MAX_SETTINGS = 512
"""Most settings per problem in ``Lessons.settings`` (the most recently measured): enough for a model of a
template space's interactions, bounded so a long history does not make every proposal slower."""

_LINE_CHARS = 160


class ChangeLesson(BaseModel):
    """What the evidence says about one change, for people."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    change: str
    """A tag (`online-softmax`, `seed`) or a parameter value (`UNROLL=8`)."""
    scope: Literal["problem", "family"]
    """`problem`: counts are the problem's own; `family`: only other problems of the family tried it."""
    attempts: int
    """Distinct candidates carrying it whose compile outcome is recorded."""
    compiled: int
    """How many of them compiled."""
    validated: int
    """Distinct candidates carrying it whose validation outcome is recorded."""
    correct: int
    """How many of them were correct."""
    versus_parent: int
    """Benchmarks of candidates that introduced it, against their parent."""
    beats_parent: int
    """How many were faster than the parent with confidence."""
    speedup_over_parent: float | None
    """Median speedup over the parent (None without a benchmark)."""
    speedup_over_parent_low: float | None
    """Lower end of a distribution-free ~95% interval of that median."""
    speedup_over_parent_high: float | None
    """Upper end of that interval."""
    advantage: float | None
    """Geometric-mean speedup over numpy of candidates carrying it, relative to all of their problem's
    candidates (1.2: they ran 20% faster than the average candidate)."""
    dead_end: str | None
    """Why it is a dead end (never compiled / never correct in N attempts), or None."""


class ChangePrior(BaseModel):
    """What the search proposer believes about one change, from the family's evidence (weighted)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    change: str
    """The change."""
    evidence: float
    """Weighted number of candidates behind it (own problem 1 each, family FAMILY_WEIGHT each, at most
    FAMILY_MAX_WEIGHT in all)."""
    correct_alpha: float
    """Beta posterior of P(correct | tried), from a Beta(1, 1) prior: 1 + weighted successes."""
    correct_beta: float
    """1 + weighted failures (compile errors and incorrect validations)."""
    beats_parent_alpha: float
    """Beta posterior of P(confidently faster than the parent), from Beta(1, 1): 1 + weighted wins."""
    beats_parent_beta: float
    """1 + weighted benchmarks that did not beat the parent with confidence."""
    log_ratio_mean: float
    """Weighted mean of ln(speedup over the parent); 0 without samples."""
    log_ratio_var: float
    """Weighted variance of those samples; 0 with fewer than two."""
    log_ratio_n: float
    """Weighted number of those samples."""
    log_advantage_mean: float
    """Weighted mean of ln(speedup over numpy) minus its problem's mean: the change's main effect."""
    log_advantage_var: float
    """Weighted variance of those samples; 0 with fewer than two."""
    log_advantage_n: float
    """Weighted number of those samples."""
    dead_end: bool
    """True when it never compiled, or was never correct, in DEAD_END_ATTEMPTS attempts or more."""


class FailurePattern(BaseModel):
    """One way candidates failed."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    kind: Literal["compile", "validation", "benchmark"]
    """The step that failed."""
    pattern: str
    """Compile error category, failing check at a shape, or benchmark verdict."""
    count: int
    """Distinct failures with this pattern on the problem (plus the family's, when scope is family)."""
    scope: Literal["problem", "family"]
    """Where the failures were seen."""
    changes: list[str]
    """The changes most often present in those failures (at most three)."""
    example: str
    """The latest failure's message."""


class SettingEvidence(BaseModel):
    """How fast one template setting ran on the target, over all its benchmarks."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    problem: str
    """The problem it was measured on: the one asked about or another of its family."""
    candidate_id: str
    """The candidate's content hash."""
    params: dict[str, Any]
    """Its template parameter values, e.g. ``{"FUSED": 0, "NT": 1}``."""
    n: int
    """Benchmarks with verdict ok behind it (the most recent LESSON_SAMPLES)."""
    log_speedup_mean: float
    """Mean of ln(speedup over numpy) of those benchmarks."""
    log_speedup_var: float
    """Their sample variance (n - 1 in the denominator); 0 with fewer than two."""
    log_interval_halfwidth: float | None = None
    """Mean half-width, in ln, of those benchmarks' intervals (a busy machine's reading counts as wide,
    see BUSY_READING_HALFWIDTH); None when none was recorded. The model counts wide readings for less."""
    method: int = LEGACY_METHOD
    """The measurement method of those benchmarks (engine/harness/verdicts.py): all of one, the newest the
    setting was read with. A setting whose readings are of an older method than the judge's today settles
    nothing (engine/proposers/setting_evidence.py settled_candidates)."""
    machine: str | None = None
    """The machine those benchmarks were taken on (engine/hardware.py machine_key): all of one, the last that
    measured the setting; None when they were recorded before outcomes named it. They settle the setting only
    for a search on that machine."""


class Lessons(BaseModel):
    """The lessons for one problem on one target."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    problem: str
    """The problem asked about."""
    family: str
    """Its family."""
    target: str
    """The resolved target."""
    through_position: int
    """The projection's checkpoint: the lessons include every event up to this position."""
    candidates: int
    """Distinct candidates of the problem with a recorded compile outcome on the target."""
    family_candidates: int
    """The same, for the other problems of the family."""
    summary: str
    """At most SUMMARY_LINES lines for prompts and people."""
    changes: list[ChangeLesson] = Field(default_factory=list)
    """Per change, those with most evidence first (at most MAX_CHANGES)."""
    priors: dict[str, ChangePrior] = Field(default_factory=dict)
    """Per change, what the search proposer samples from (at most MAX_CHANGES)."""
    failures: list[FailurePattern] = Field(default_factory=list)
    """The most frequent failure patterns (at most ten)."""
    dead_ends: list[str] = Field(default_factory=list)
    """Changes that never compiled or were never correct after DEAD_END_ATTEMPTS attempts."""
    settings: list[SettingEvidence] = Field(default_factory=list)
    """Measured template settings on the target: the problem's own and those of the other problems of its
    family (see .problem), at most MAX_SETTINGS per problem, the most recently measured; sorted by
    (problem, candidate_id)."""


# -- reading the view ---------------------------------------------------------------------------------------


class _Row:
    """One lesson_stats row, with the problem it belongs to."""

    def __init__(self, record: asyncpg.Record) -> None:
        self.problem: str = record["problem"]
        self.change: str = record["change"]
        self.attempts: int = record["attempts"]
        self.compiled: int = record["compiled"]
        self.validated: int = record["validated"]
        self.correct: int = record["correct"]
        self.versus_parent: int = record["versus_parent"]
        self.beats_parent: int = record["beats_parent"]
        self.log_ratio: list[float] = list(record["log_ratio_samples"])
        self.log_speedup: list[float] = list(record["log_speedup_samples"])


async def lessons_for(
    store: EventStore,
    problem: str,
    target: str,
    *,
    catch_up: bool = True,
    parameters: set[str] | None = None,
) -> Lessons:
    """The lessons for ``problem`` (its NAME; a folder path is mapped to the name it declares) on ``target``
    (``cpu`` means this machine's CPU target). ``parameters``: the problem's template parameters, when the
    caller has the problem loaded (otherwise it is loaded by name, which only finds built-in problems).

    Catches the projection up first, so the answer includes every event appended before the call; pass
    ``catch_up=False`` to read the view as it stands (cheaper when the caller just caught it up)."""
    if catch_up:
        position = await catch_up_lessons(store)
    else:
        position = await checkpoint_of(store.pool, PROJECTION)
    target = _resolved(target)
    problem = problem_key(problem)
    family = await _family(store, problem)
    stats = [
        _Row(r)
        for r in await store.pool.fetch(
            "SELECT * FROM lesson_stats WHERE family = $1 AND target = $2 ORDER BY problem, change", family, target
        )
    ]
    failures = await store.pool.fetch(
        "SELECT * FROM lesson_failures WHERE family = $1 AND target = $2 ORDER BY problem, change, kind, pattern",
        family,
        target,
    )
    # Only the MAX_SETTINGS most recently measured settings of each problem are used (_setting_evidence):
    # the rest stay in the database. On a log of 100,000 events, sending a family's every setting was a third of
    # a call. "C" ordering is Python's, so the cut is the one _setting_evidence would make.
    settings = await store.pool.fetch(
        """
        SELECT problem, candidate_id, params, log_speedup_samples, log_halfwidth_samples, last_position, method,
               machine
        FROM (
            SELECT *, row_number() OVER (
                PARTITION BY problem ORDER BY last_position DESC, candidate_id COLLATE "C"
            ) AS recency
            FROM lesson_settings
            WHERE family = $1 AND target = $2 AND cardinality(log_speedup_samples) > 0
        ) AS ranked
        WHERE recency <= $3
        ORDER BY problem, candidate_id
        """,
        family,
        target,
        MAX_SETTINGS,
    )
    known = parameters if parameters is not None else _parameters(problem)
    return build_lessons(problem, family, target, int(position or 0), stats, failures, known, settings)


def problem_key(problem: str) -> str:
    """The key lessons are stored under for a problem given by name or folder: its NAME. A name that is no
    folder here is taken as it is (lessons can be read on a machine without the problem's folder)."""
    if "/" not in problem and not problem.startswith("."):
        return problem
    from engine.problems import load_problem

    try:
        return load_problem(problem).name
    except UserError:
        return problem.rstrip("/").rsplit("/", 1)[-1] or problem


async def family_targets(store: EventStore, problem: str) -> list[str]:
    """The targets on which ``problem``'s family has lessons (its own or its relatives'); catches up first."""
    await catch_up_lessons(store)
    family = await _family(store, problem_key(problem))
    rows = await store.pool.fetch("SELECT DISTINCT target FROM lesson_stats WHERE family = $1 ORDER BY target", family)
    return [r["target"] for r in rows]


async def known_lessons(store: EventStore, target: str | None = None) -> list[tuple[str, str]]:
    """The (problem, target) pairs the view holds lessons for, sorted; catches the projection up first."""
    await catch_up_lessons(store)
    rows = await store.pool.fetch(
        "SELECT DISTINCT problem, target FROM lesson_stats WHERE $1::text IS NULL OR target = $1 "
        "ORDER BY problem, target",
        None if target is None else _resolved(target),
    )
    return [(r["problem"], r["target"]) for r in rows]


def _resolved(target: str) -> str:
    if target == "cpu":
        from engine.hardware import cpu_target

        return cpu_target()
    return target


def _parameters(problem: str) -> set[str] | None:
    """The problem's template parameter names (None when it cannot be loaded here)."""
    from engine.problems import load_problem

    try:
        return set(load_problem(problem).template_params)
    except UserError:
        return None


async def _family(store: EventStore, problem: str) -> str:
    family = await store.pool.fetchval(
        "SELECT family FROM lesson_searches WHERE problem = $1 ORDER BY stream_id LIMIT 1", problem
    )
    if family is not None:
        return str(family)
    from engine.problems import load_problem

    try:
        return load_problem(problem).family
    except UserError:
        return problem


# -- from rows to lessons ----------------------------------------------------------------------------------


def build_lessons(
    problem: str,
    family: str,
    target: str,
    position: int,
    stats: Sequence[_Row],
    failures: Sequence[asyncpg.Record],
    parameters: set[str] | None = None,
    settings: Sequence[asyncpg.Record | dict[str, Any]] = (),
) -> Lessons:
    """Lessons from the view's rows for one family and target (pure: no database). ``parameters``, the
    problem's template parameter names, keeps the summary to family lessons the problem can use;
    ``settings``, the family's lesson_settings rows on the target, become ``Lessons.settings``."""
    own = {r.change: r for r in stats if r.problem == problem}
    others: dict[str, list[_Row]] = defaultdict(list)
    for r in stats:
        if r.problem != problem:
            others[r.change].append(r)
    centres = {r.problem: _mean(r.log_speedup) for r in stats if r.change == ALL and r.log_speedup}
    names = sorted((set(own) | set(others)) - {ALL})
    priors = {name: _prior(name, own.get(name), others.get(name, []), centres) for name in names}
    ranked = sorted(names, key=lambda n: (-priors[n].evidence, n))[:MAX_CHANGES]
    changes = [_change_lesson(n, own.get(n), others.get(n, []), priors[n]) for n in ranked]
    patterns = _failure_patterns(problem, failures)
    dead = sorted(c.change for c in changes if c.dead_end)
    lessons = Lessons(
        problem=problem,
        family=family,
        target=target,
        through_position=position,
        candidates=own[ALL].attempts if ALL in own else 0,
        family_candidates=sum(r.attempts for r in others.get(ALL, [])),
        summary="",
        changes=changes,
        priors={n: priors[n] for n in ranked},
        failures=patterns,
        dead_ends=dead,
        settings=_setting_evidence(settings),
    )
    lessons.summary = summarize(lessons, parameters)
    return lessons


def _weighted(own: _Row | None, others: Sequence[_Row]) -> list[tuple[float, _Row]]:
    """Each row with its weight: 1 for the problem's own, FAMILY_WEIGHT for the family's, scaled down so
    the family's rows weigh at most FAMILY_MAX_WEIGHT candidates together."""
    tried = sum(r.attempts for r in others)
    family = min(FAMILY_WEIGHT, FAMILY_MAX_WEIGHT / tried) if tried else FAMILY_WEIGHT
    return ([(1.0, own)] if own else []) + [(family, r) for r in others]


def _prior(name: str, own: _Row | None, others: list[_Row], centres: dict[str, float]) -> ChangePrior:
    rows = _weighted(own, others)
    good = sum(w * r.correct for w, r in rows)
    bad = sum(w * ((r.attempts - r.compiled) + (r.validated - r.correct)) for w, r in rows)
    wins = sum(w * r.beats_parent for w, r in rows)
    losses = sum(w * (r.versus_parent - r.beats_parent) for w, r in rows)
    ratio = [(w, s) for w, r in rows for s in r.log_ratio]
    advantage = [(w, s - centres[r.problem]) for w, r in rows if r.problem in centres for s in r.log_speedup]
    ratio_mean, ratio_var, ratio_n = _weighted_moments(ratio)
    adv_mean, adv_var, adv_n = _weighted_moments(advantage)
    return ChangePrior(
        change=name,
        evidence=sum(w * r.attempts for w, r in rows),
        correct_alpha=1.0 + good,
        correct_beta=1.0 + bad,
        beats_parent_alpha=1.0 + wins,
        beats_parent_beta=1.0 + losses,
        log_ratio_mean=ratio_mean,
        log_ratio_var=ratio_var,
        log_ratio_n=ratio_n,
        log_advantage_mean=adv_mean,
        log_advantage_var=adv_var,
        log_advantage_n=adv_n,
        dead_end=_dead_end(rows) is not None,
    )


def _dead_end(rows: list[tuple[float, _Row]]) -> str | None:
    attempts = sum(r.attempts for _, r in rows)
    validated = sum(r.validated for _, r in rows)
    if attempts >= DEAD_END_ATTEMPTS and sum(r.compiled for _, r in rows) == 0:
        return f"never compiled in {attempts} attempts"
    if validated >= DEAD_END_ATTEMPTS and sum(r.correct for _, r in rows) == 0:
        return f"never correct in {validated} validations"
    return None


def _change_lesson(name: str, own: _Row | None, others: list[_Row], prior: ChangePrior) -> ChangeLesson:
    rows = [own] if own else others
    ratios = sorted(math.exp(s) for r in rows for s in r.log_ratio)
    median, low, high = _median_interval(ratios)
    return ChangeLesson(
        change=name,
        scope="problem" if own else "family",
        attempts=sum(r.attempts for r in rows),
        compiled=sum(r.compiled for r in rows),
        validated=sum(r.validated for r in rows),
        correct=sum(r.correct for r in rows),
        versus_parent=sum(r.versus_parent for r in rows),
        beats_parent=sum(r.beats_parent for r in rows),
        speedup_over_parent=median,
        speedup_over_parent_low=low,
        speedup_over_parent_high=high,
        advantage=math.exp(prior.log_advantage_mean) if prior.log_advantage_n else None,
        dead_end=_dead_end([(1.0, r) for r in rows]),
    )


def _setting_evidence(rows: Sequence[asyncpg.Record | dict[str, Any]]) -> list[SettingEvidence]:
    """The rows with samples as SettingEvidence: per problem the MAX_SETTINGS most recently measured,
    all sorted by (problem, candidate_id)."""
    by_problem: dict[str, list[asyncpg.Record | dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["log_speedup_samples"]:
            by_problem[row["problem"]].append(row)
    kept = [
        row
        for problem_rows in by_problem.values()
        # candidate_id breaks ties so the choice does not depend on the rows' order.
        for row in sorted(problem_rows, key=lambda r: (-r["last_position"], r["candidate_id"]))[:MAX_SETTINGS]
    ]
    evidence = []
    for row in sorted(kept, key=lambda r: (r["problem"], r["candidate_id"])):
        samples = list(row["log_speedup_samples"])
        widths = [w for w in list(row.get("log_halfwidth_samples") or [])[-len(samples) :] if math.isfinite(w)]
        evidence.append(
            SettingEvidence(
                problem=row["problem"],
                candidate_id=row["candidate_id"],
                params=params_of(row["params"]),
                n=len(samples),
                log_speedup_mean=_mean(samples),
                log_speedup_var=_sample_variance(samples),
                log_interval_halfwidth=_mean(widths) if widths else None,
                method=int(row.get("method") or LEGACY_METHOD),
                machine=row.get("machine"),
            )
        )
    return evidence


def _failure_patterns(problem: str, records: Sequence[asyncpg.Record]) -> list[FailurePattern]:
    totals: dict[tuple[str, str], list[asyncpg.Record]] = defaultdict(list)
    for r in records:
        totals[(r["kind"], r["pattern"])].append(r)
    patterns = []
    for (kind, pattern), rows in totals.items():
        mine = [r for r in rows if r["problem"] == problem]
        chosen = mine or rows
        everything = [r for r in chosen if r["change"] == ALL]
        if not everything:
            continue
        latest = max(everything, key=lambda r: r["last_position"])
        by_change = sorted(
            ((r["count"], r["change"]) for r in chosen if r["change"] != ALL), key=lambda t: (-t[0], t[1])
        )
        patterns.append(
            FailurePattern(
                kind=kind,
                pattern=pattern,
                count=sum(r["count"] for r in everything),
                scope="problem" if mine else "family",
                changes=[c for _, c in by_change[:3]],
                example=latest["example"],
            )
        )
    patterns.sort(key=lambda p: (p.scope != "problem", -p.count, p.kind, p.pattern))
    return patterns[:10]


# -- statistics ------------------------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _sample_variance(values: Sequence[float]) -> float:
    """The unbiased sample variance (0 for fewer than two values), in floats: statistics.variance computes
    exactly with fractions, which made it most of a lessons_for call's time on a large log."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    return math.fsum((v - mean) ** 2 for v in values) / (n - 1)


def _weighted_moments(samples: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(mean, variance, total weight) of weighted samples; zeros without samples."""
    if not samples:
        return 0.0, 0.0, 0.0
    # In numpy: a family's changes carry tens of thousands of samples on a large log.
    pairs = np.asarray(samples, dtype=float)
    weights, values = pairs[:, 0], pairs[:, 1]
    total = float(weights.sum())
    if total <= 0:
        return 0.0, 0.0, 0.0
    mean = float(weights @ values) / total
    var = float(weights @ (values - mean) ** 2) / total if len(samples) > 1 else 0.0
    return mean, var, total


def _median_interval(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """Median of sorted ``values`` and a distribution-free ~95% interval for it (order statistics at
    n/2 ± 0.98·√n, the normal approximation to the binomial); the range for fewer than six values."""
    n = len(values)
    if n == 0:
        return None, None, None
    median = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    if n < 6:
        return median, values[0], values[-1]
    spread = 0.98 * math.sqrt(n)
    low = max(0, math.floor(n / 2 - spread))
    high = min(n - 1, math.ceil(n / 2 + spread) - 1)
    return median, values[low], values[high]


# -- summary --------------------------------------------------------------------------------------------------


def _line(text: str) -> str:
    text = " ".join(text.split())  # one line, whatever a compiler message holds
    return text if len(text) <= _LINE_CHARS else text[: _LINE_CHARS - 1] + "…"


def _describe(c: ChangeLesson) -> str:
    parts = []
    if c.advantage is not None:
        parts.append(f"{c.advantage:.2f}x vs the average candidate")
    if c.speedup_over_parent is not None:
        if c.versus_parent > 1:
            parts.append(
                f"{c.speedup_over_parent:.2f}x over parent [{c.speedup_over_parent_low:.2f}, "
                f"{c.speedup_over_parent_high:.2f}] in {c.versus_parent} benchmarks"
            )
        else:
            parts.append(f"{c.speedup_over_parent:.2f}x over parent in 1 benchmark")
    parts.append(f"correct {c.correct}/{c.attempts}")
    where = "" if c.scope == "problem" else " (family)"
    return f"{c.change}{where}: " + ", ".join(parts)


def _applies(change: ChangeLesson, parameters: set[str] | None) -> bool:
    """True for the problem's own lessons, family tags, and family parameter values the problem has."""
    if change.scope == "problem" or parameters is None or "=" not in change.change:
        return True
    return change.change.split("=", 1)[0] in parameters


def summarize(lessons: Lessons, parameters: set[str] | None = None) -> str:
    """At most SUMMARY_LINES lines: the totals, the fastest measured settings, the changes that helped and
    hurt most, dead ends and the most frequent failures. With ``parameters`` (the problem's template
    parameter names), family lessons about parameters the problem lacks are left out."""
    lines = []
    if not lessons.candidates and not lessons.family_candidates:
        return _line(f"No lessons yet for {lessons.problem} ({lessons.family}) on {lessons.target}.")
    header = f"Lessons for {lessons.problem} ({lessons.family}) on {lessons.target}: {lessons.candidates} candidates"
    if lessons.family_candidates:
        header += f", plus {lessons.family_candidates} from other problems of the family"
    lines.append(_line(header + "."))
    fastest = sorted(
        (s for s in lessons.settings if s.problem == lessons.problem),
        key=lambda s: (-s.log_speedup_mean, s.candidate_id),
    )[:2]
    if fastest:
        shown = [
            f"{' '.join(f'{k}={v}' for k, v in sorted(s.params.items()))} {math.exp(s.log_speedup_mean):.2f}x (n={s.n})"
            for s in fastest
        ]
        lines.append(_line("Fastest measured settings (speedup over numpy): " + "; ".join(shown)))

    def score(c: ChangeLesson) -> float:
        if c.advantage is not None:
            return math.log(c.advantage)
        return math.log(c.speedup_over_parent) if c.speedup_over_parent else 0.0

    measured = [
        c
        for c in lessons.changes
        if (c.advantage is not None or c.speedup_over_parent is not None) and _applies(c, parameters)
    ]
    # A change that is fast but mostly wrong is not a help: its failures are listed below instead.
    helped = sorted(
        (c for c in measured if score(c) > 0 and 2 * c.correct >= c.attempts), key=lambda c: (-score(c), c.change)
    )[:5]
    hurt = sorted((c for c in measured if score(c) < 0), key=lambda c: (score(c), c.change))[:3]
    lines += [_line("+ " + _describe(c)) for c in helped]
    lines += [_line("- " + _describe(c)) for c in hurt]
    if lessons.dead_ends:
        dead = {c.change: c.dead_end for c in lessons.changes if c.dead_end}
        shown = [f"{n} ({dead[n]})" for n in lessons.dead_ends[:4]]
        more = len(lessons.dead_ends) - len(shown)
        lines.append(_line("Dead ends: " + "; ".join(shown) + (f"; and {more} more" if more > 0 else "")))
    for f in lessons.failures[:3]:
        with_changes = f" (often with {', '.join(f.changes)})" if f.changes else ""
        where = "" if f.scope == "problem" else " in the family"
        lines.append(_line(f"! {f.kind} failure {f.pattern!r} x{f.count}{where}{with_changes}: {f.example}"))
    return "\n".join(lines[:SUMMARY_LINES])
