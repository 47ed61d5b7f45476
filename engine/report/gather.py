"""A search's report, gathered from its event log alone: candidates, evaluations, promotions, roofline figures.

The log, not Temporal, is the record (engine/search/history.py): a report can be made while the search runs,
after its workflow history is gone, or on another machine. Nothing here trusts the text the log holds --
labels, rationales and sources are proposer-written -- it only carries it to the page, which escapes it.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from engine.errors import NoEvents
from engine.evidence.events import RecordedEvent
from engine.evidence.store import EventStore
from engine.harness.stats import RatioEstimate, weighted_geomean
from engine.report.lessons_delta import lessons_report
from engine.report.model import (
    CandidateEntry,
    EvaluationPoint,
    IncumbentStep,
    LessonsReport,
    SearchReport,
    ShapeRoofline,
)
from engine.search.candidates import Candidate
from engine.search.history import STEP_EVENTS, CandidateRecord, SearchHistory, rebuild, stream_of, was_busy

NO_OUTCOME = ("unfinished", "proposed")
"""CandidateRecord.verdict of a candidate with no outcome yet: not an evaluation (a harness error is one: the
search spent it)."""

MAX_DIFF_LINES = 400
"""Longest source diff (or source) a candidate's row carries; the rest is counted, not shown."""


async def gather_report(database_url: str, search_id: str, *, with_lessons: bool = True) -> SearchReport:
    """The report of ``search_id`` from the event log at ``database_url``; NoEvents (a UserError) naming the fix
    when the log holds no such search. ``with_lessons=False`` skips recomputing the lessons (the slow part on a long
    log), as a comparison does."""
    store = await EventStore.connect(database_url, max_size=2)
    try:
        events = await store.read_stream(stream_of(search_id))
        if not events:
            raise NoEvents(
                search_id,
                f"no events for search {search_id!r} in the event log; `kf search list` shows the search ids "
                "(or point --database-url / KF_DATABASE_URL at the database the search wrote to)",
            )
        history = rebuild(search_id, events)
        proposed = _proposed_candidates(events)
        missing = {c.parent_id for c in proposed.values() if c.parent_id is not None and c.parent_id not in proposed}
        parents = {**await _candidates_elsewhere(store, missing), **proposed}
    finally:
        await store.close()
    report = _report(history, proposed, parents)
    if with_lessons and history.started is not None:
        report.lessons = await lessons_report(
            database_url, report.problem, report.target, history.started.position, events
        )
    return report


def _report(history: SearchHistory, proposed: dict[str, Candidate], parents: dict[str, Candidate]) -> SearchReport:
    started = history.started.payload if history.started else {}
    spec: dict[str, Any] = dict(started.get("spec") or {})
    resolved = next((e.payload.get("target") for e in history.events if e.type == "search.target_resolved"), None)
    finished = history.finished.payload if history.finished else {}
    evaluations = _evaluations(history)
    numbers = {point.candidate_id: point.number for point in evaluations}
    promoted = {p.get("candidate_id") for p in history.promotions}
    entries = [
        _entry(record, proposed.get(cid), parents, numbers.get(cid), cid in promoted)
        for cid, record in history.candidates.items()
    ]
    entries.sort(key=lambda e: (e.evaluation is None, e.evaluation or 0))
    incumbent = history.incumbent
    return SearchReport(
        search_id=history.search_id,
        problem=str(spec.get("problem", "")),
        target=str(resolved or spec.get("target", "")),
        status=str(finished.get("status") or "running"),
        spec=spec,
        resumed_from=started.get("resumed_from"),
        started_at=history.started.recorded_at.isoformat() if history.started else None,
        finished_at=history.finished.recorded_at.isoformat() if history.finished else None,
        hardware=_hardware(history),
        events=len(history.events),
        verdict_counts=history.verdict_counts,
        harness_errors=len(history.harness_errors),
        timings=len(history.timings),
        busy_timings=sum(was_busy(event) for event in history.timings),
        best=RatioEstimate(incumbent.speedup, incumbent.ci_low, incumbent.ci_high) if incumbent else None,
        best_label=incumbent.candidate.label if incumbent else None,
        best_id=incumbent.candidate.candidate_id if incumbent else None,
        candidates=entries,
        evaluations=evaluations,
        incumbents=_incumbent_steps(history),
        lessons=LessonsReport(available=False, reason="not computed"),
    )


def _proposed_candidates(events: list[RecordedEvent]) -> dict[str, Candidate]:
    """Every candidate the search proposed (its seed included), by id, as first proposed."""
    found: dict[str, Candidate] = {}
    for event in events:
        if event.type == "candidate.proposed":
            candidate = _candidate(event.payload.get("candidate"))
            if candidate is not None:
                found.setdefault(candidate.candidate_id, candidate)
        elif event.type == "incumbent.promoted":
            candidate = _candidate((event.payload.get("incumbent") or {}).get("candidate"))
            if candidate is not None:
                found.setdefault(candidate.candidate_id, candidate)
    return found


async def _candidates_elsewhere(store: EventStore, ids: set[str]) -> dict[str, Candidate]:
    """Parents proposed by another search (a resumed search's seed descends from the earlier search's
    candidates): their first proposal anywhere in the log."""
    wanted = sorted(ids)
    if not wanted:
        return {}
    rows = await store.pool.fetch(
        "SELECT DISTINCT ON (payload->'candidate'->>'candidate_id') payload FROM events "
        "WHERE type = 'candidate.proposed' AND payload->'candidate'->>'candidate_id' = ANY($1::text[]) "
        "ORDER BY payload->'candidate'->>'candidate_id', position",
        wanted,
    )
    found = (_candidate(row["payload"].get("candidate")) for row in rows)
    return {c.candidate_id: c for c in found if c is not None}


def _candidate(raw: Any) -> Candidate | None:
    try:
        return Candidate.model_validate(raw)
    except ValidationError:  # an event an older or newer writer shaped otherwise: the row shows what history knows
        return None


def _evaluations(history: SearchHistory) -> list[EvaluationPoint]:
    """The candidates with a verdict (or a harness error), in the order their last outcome was recorded."""
    finished = [
        (position, cid, record)
        for cid, record in history.candidates.items()
        if (position := _last_outcome(record)) is not None
    ]
    finished.sort(key=lambda item: item[0])
    return [
        EvaluationPoint(number=n, candidate_id=cid, verdict=record.verdict, speedup=_speedup(record))
        for n, (_, cid, record) in enumerate(finished, start=1)
    ]


def _incumbent_steps(history: SearchHistory) -> list[IncumbentStep]:
    """Every promotion, with how many evaluations had finished when it was recorded."""
    finished_at = sorted(p for p in (_last_outcome(r) for r in history.candidates.values()) if p is not None)
    steps = []
    for event in history.events:
        if event.type != "incumbent.promoted":
            continue
        incumbent = event.payload.get("incumbent") or {}
        speedup = incumbent.get("speedup")
        if speedup is None:
            continue
        candidate = incumbent.get("candidate") or {}
        steps.append(
            IncumbentStep(
                after_evaluation=sum(1 for p in finished_at if p < event.position),
                candidate_id=str(event.payload.get("candidate_id") or candidate.get("candidate_id", "")),
                label=str(event.payload.get("label") or candidate.get("label", "")),
                speedup=RatioEstimate(
                    float(speedup),
                    float(incumbent.get("ci_low", speedup)),
                    float(incumbent.get("ci_high", speedup)),
                ),
                generation=int(event.payload.get("generation") or 0),
                reason=str(event.payload.get("reason", "")),
            )
        )
    return steps


def _last_outcome(record: CandidateRecord) -> int | None:
    """Position of the candidate's last recorded outcome; None while it has no verdict (or harness error)."""
    if record.verdict in NO_OUTCOME:
        return None
    outcomes = [*record.steps.values(), *([record.harness_error] if record.harness_error else [])]
    return max(e.position for e in outcomes)


def _speedup(record: CandidateRecord) -> RatioEstimate | None:
    """Speedup over the library baseline, when the candidate was timed and its verdict is ok."""
    return _measured(record, "speedup") if record.verdict == "ok" else None


def _measured(record: CandidateRecord, name: str) -> RatioEstimate | None:
    event = record.steps.get("candidate.benchmarked")
    output = (event.payload.get("output") or {}) if event else {}
    value = output.get(name)
    if value is None:
        return None
    low, high = output.get(f"{name}_ci_low"), output.get(f"{name}_ci_high")
    return RatioEstimate(float(value), float(value if low is None else low), float(value if high is None else high))


def _entry(
    record: CandidateRecord,
    candidate: Candidate | None,
    parents: dict[str, Candidate],
    evaluation: int | None,
    promoted: bool,
) -> CandidateEntry:
    parent_id = candidate.parent_id if candidate else record.parent_id
    parent = parents.get(parent_id) if parent_id else None
    params = dict(candidate.params) if candidate else {}
    changed = {}
    if parent is not None and parent.params:  # from a hand-written parent every value is new: none "changed"
        names = sorted(set(params) | set(parent.params), key=str)
        changed = {
            name: (parent.params.get(name), params.get(name))
            for name in names
            if parent.params.get(name) != params.get(name)
        }
    benchmark = record.steps.get("candidate.benchmarked")
    return CandidateEntry(
        candidate_id=record.candidate_id,
        label=record.label or (candidate.label if candidate else ""),
        generation=record.generation,
        proposer=record.proposer or (candidate.proposer if candidate else ""),
        rationale=candidate.rationale if candidate else "",
        tags=list(candidate.tags) if candidate else list(record.tags),
        params=params,
        flags=candidate.flags if candidate else None,
        parent_id=parent_id,
        parent_label=parent.label if parent else None,
        changed_params=changed,
        source_diff=_source_diff(candidate, parent),
        verdict=record.verdict,
        summary=_summary(record),
        evaluation=evaluation,
        speedup=_speedup(record),
        ratio=_measured(record, "ratio") if record.verdict == "ok" else None,
        roofline_fraction=_roofline_fraction(benchmark),
        shapes=_shapes(benchmark),
        promoted=promoted,
    )


def _source_diff(candidate: Candidate | None, parent: Candidate | None) -> str:
    if candidate is None:
        return ""
    if parent is None:
        lines = candidate.source.splitlines()
    else:
        lines = list(
            difflib.unified_diff(
                parent.source.splitlines(),
                candidate.source.splitlines(),
                fromfile=f"parent {parent.candidate_id[:12]}",
                tofile=f"this {candidate.candidate_id[:12]}",
                lineterm="",
                n=2,
            )
        )
        if not lines:
            flags = f"; flags {candidate.flags}, the parent's {parent.flags}" if candidate.flags != parent.flags else ""
            return f"(the parent's source){flags}"
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"… {len(lines) - MAX_DIFF_LINES} more lines (kf audit shows the events)"]
    return "\n".join(lines)


def _summary(record: CandidateRecord) -> str:
    """The line of the step that decided the verdict (the harness's error for a harness error)."""
    for step in STEP_EVENTS:
        event = record.steps.get(step)
        if event is None:
            break
        output = event.payload.get("output") or {}
        if output.get("verdict") != "ok" or step == STEP_EVENTS[-1]:
            return str(output.get("summary", ""))
    if record.harness_error is not None:
        payload = record.harness_error.payload
        return f"not judged: {payload.get('step', '?')} failed in the harness: {payload.get('error', '')}"
    return ""


def _timed_report(benchmark: RecordedEvent | None) -> tuple[dict[str, Any], bool] | None:
    """The benchmark report against the library baseline (the last one) and True; or, when the worker could
    not time the library (a GPU worker without CuPy), the first report that timed the candidate and False."""
    if benchmark is None:
        return None
    reports = [r for r in ((benchmark.payload.get("evidence") or {}).get("reports") or []) if isinstance(r, dict)]
    timed = [r for r in reports if r.get("verdict") == "ok"]
    if not timed:
        return None
    return (reports[-1], True) if reports[-1].get("verdict") == "ok" else (timed[0], False)


def _roofline_fraction(benchmark: RecordedEvent | None) -> float | None:
    """The report's roofline fraction; computed from its shapes (weighted geometric mean of roofline_ns /
    candidate_ns, as the CUDA judge computes it) where the judge did not record one (the CPU judge)."""
    found = _timed_report(benchmark)
    if found is None:
        return None
    if found[0].get("roofline_fraction") is not None:
        return float(found[0]["roofline_fraction"])
    pairs = []
    for timing in found[0].get("shapes") or []:
        try:
            bound, time, weight = float(timing["roofline_ns"]), float(timing["candidate_ns"]), float(timing["weight"])
        except (KeyError, TypeError, ValueError):
            return None  # a shape without a bound: no fraction for the whole
        if bound <= 0 or time <= 0 or weight <= 0:
            return None
        pairs.append((bound / time, weight))
    return weighted_geomean([f for f, _ in pairs], [w for _, w in pairs]) if pairs else None


def _shapes(benchmark: RecordedEvent | None) -> list[ShapeRoofline]:
    found = _timed_report(benchmark)
    if found is None:
        return []
    report, library = found
    shapes = []
    for timing in report.get("shapes") or []:
        try:
            shapes.append(
                ShapeRoofline(
                    shape=shape_text(timing["shape"]),
                    candidate_ns=float(timing["candidate_ns"]),
                    library_ns=float(timing["reference_ns"]) if library else None,
                    roofline_ns=None if timing.get("roofline_ns") is None else float(timing["roofline_ns"]),
                )
            )
        except (KeyError, TypeError, ValueError):  # a report shaped by another version: its figures are skipped
            continue
    return shapes


def shape_text(shape: Any) -> str:
    """A shape's sizes as ``name=value`` words, sorted by name: ``cols=4096 rows=64``."""
    if isinstance(shape, dict):
        return " ".join(f"{k}={v}" for k, v in sorted(shape.items(), key=lambda kv: str(kv[0])))
    return str(shape)


def _hardware(history: SearchHistory) -> str:
    """The machine of the search's benchmarks, as their reports name it."""
    for record in history.candidates.values():
        found = _timed_report(record.steps.get("candidate.benchmarked"))
        hardware = (found[0] if found else {}).get("hardware") or {}
        if hardware:
            gpu = (hardware.get("gpu") or {}).get("name")
            cpu = hardware.get("cpu_model", "")
            cores = hardware.get("cores_used")
            text = f"{cpu}, {cores} core(s)" if cores else str(cpu)
            return f"{gpu} ({text})" if gpu else text
    return "no benchmark recorded"
