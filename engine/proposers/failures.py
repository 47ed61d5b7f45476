"""Recent failures: the evidence a fixer repairs from.

A failure is one candidate that did not compile, was wrong, crashed or timed out, or one LLM reply that was
rejected before compiling. It carries the one line a person (or a model) needs to repair it — the first
compile error, the worst incorrect case — and the source it concerns, bounded in size so prompts stay small.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from engine.evidence.events import RECORDED_COLUMNS, RecordedEvent
from engine.evidence.store import EventStore
from engine.outages import is_kernel_outcome

FailureStage = Literal["proposal", "compile", "validate", "benchmark"]
SOURCE_LIMIT = 8000
"""Characters of a failing source kept in a failure (a kernel is a few KiB; a model's runaway reply is not)."""
MESSAGE_LIMIT = 600
"""Characters of a failure's message kept."""


class RecentFailure(BaseModel):
    """One recent failure of a search, newest first in ``ProposalContext.recent_failures``."""

    stage: FailureStage
    """Where it failed: `proposal` (the reply was rejected before compiling), `compile`, `validate`, `benchmark`."""
    verdict: str
    """The verdict (`compile_error`, `incorrect`, `crash`, …) or, for a proposal, the rejection reason."""
    message: str
    """The first compile error, the worst failing case, or why the reply was rejected."""
    candidate_id: str | None = None
    """The failing candidate; None for a rejected reply (it never became a candidate)."""
    label: str = ""
    """The candidate's human name, or the role and model of a rejected reply."""
    source: str = ""
    """The failing source (bounded), or an excerpt of the rejected reply."""
    category: str | None = None
    """The compile error's category (`syntax`, `undeclared`, …) or the failing check (`output`, `signal`, …)."""
    generation: int | None = None
    """The generation it belongs to."""


def _bounded(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f"\n… [{len(text) - limit} more characters]"


def failure_from_compile(
    candidate_id: str, source: str, result: Any, *, label: str = "", generation: int | None = None
) -> RecentFailure:
    """The failure of a candidate whose CompileResult (or its JSON) is not ok."""
    data = result.model_dump(mode="json") if hasattr(result, "model_dump") else dict(result)
    return RecentFailure(
        stage="compile",
        verdict=str(data.get("verdict", "compile_error")),
        message=_bounded(data.get("first_error") or data.get("log") or "did not compile", MESSAGE_LIMIT),
        candidate_id=candidate_id,
        label=label,
        source=_bounded(source, SOURCE_LIMIT),
        category=data.get("error_category"),
        generation=generation,
    )


def failure_from_validation(
    candidate_id: str,
    source: str,
    report: Any,
    *,
    stage: FailureStage = "validate",
    label: str = "",
    generation: int | None = None,
) -> RecentFailure:
    """The failure of a candidate whose ValidationReport (or BenchmarkReport, or their JSON) is not ok.

    The worst case is the one with the largest error outside tolerance; a crash or timeout has one case."""
    data = report.model_dump(mode="json") if hasattr(report, "model_dump") else dict(report)
    cases: list[dict[str, Any]] = list(data.get("cases") or [])
    worst = max(cases, key=lambda c: c.get("max_abs_err") or 0.0) if cases else None
    if worst is not None:
        where = f" (shape {worst.get('shape')}, distribution {worst.get('distribution')}, seed {worst.get('seed')})"
        message = str(worst.get("message", "")) + where
    else:
        message = str(data.get("message") or data.get("verdict", "failed"))
    tail = data.get("output_tail") or ""
    if tail:
        message += f"; its output ended with: {tail[-200:]}"
    return RecentFailure(
        stage=stage,
        verdict=str(data.get("verdict", "incorrect")),
        message=_bounded(message, MESSAGE_LIMIT),
        candidate_id=candidate_id,
        label=label,
        source=_bounded(source, SOURCE_LIMIT),
        category=worst.get("check") if worst else None,
        generation=generation,
    )


def failure_from_rejected_reply(
    reason: str, message: str, reply_excerpt: str, *, label: str = "", generation: int | None = None
) -> RecentFailure:
    """The failure of an LLM reply rejected before compiling (no code, forbidden call, wrong signature)."""
    return RecentFailure(
        stage="proposal",
        verdict=reason,
        message=_bounded(message, MESSAGE_LIMIT),
        label=label,
        source=_bounded(reply_excerpt, SOURCE_LIMIT),
        generation=generation,
    )


_STEP_STAGES: dict[str, FailureStage] = {
    "candidate.compiled": "compile",
    "candidate.validated": "validate",
    "candidate.benchmarked": "benchmark",
}


FAILURE_PAGE = 64
"""Failing events read per query, newest first, while looking for a search's newest failures: a long search
with thousands of failures is read a page at a time, not whole, on every proposal round."""

_FAILING = """
    stream_id = $1
    AND (type = 'proposal.failed'
         OR (type = ANY($2::text[]) AND COALESCE(payload -> 'output' ->> 'verdict', 'ok') <> 'ok'))
"""

_FAILURE_PAGE = f"""
SELECT {RECORDED_COLUMNS} FROM events
WHERE {_FAILING} AND stream_version < $3
ORDER BY stream_version DESC
LIMIT $4
"""

_PROPOSALS = f"""
SELECT {RECORDED_COLUMNS} FROM events
WHERE stream_id = $1 AND type = 'candidate.proposed' AND payload -> 'candidate' ->> 'candidate_id' = ANY($2::text[])
  AND stream_version < $3
ORDER BY stream_version DESC
LIMIT $4
"""


async def read_recent_failures(store: EventStore, stream_id: str, limit: int = 5) -> list[RecentFailure]:
    """`recent_failures_from_events` of a search's stream, reading only what it uses: the newest failing
    outcomes and rejected replies, a page at a time until ``limit`` failures are found (a harness's failure is
    read but not counted), then those candidates' proposals (newest first: a proposal comes shortly before its
    outcome). The database picks them out, so a proposal round neither decodes every event of a long search
    nor every failure of one that failed thousands of times (bench/failures_scale.py)."""
    if limit <= 0:
        return []
    failing: list[RecordedEvent] = []
    candidates: set[str] = set()
    counted = 0
    cursor = 2**31 - 1  # above any stream_version (an integer column)
    while counted < limit:
        page = [
            RecordedEvent.from_row(row)
            for row in await store.pool.fetch(_FAILURE_PAGE, stream_id, list(_STEP_STAGES), cursor, FAILURE_PAGE)
        ]
        for event in page:
            if event.type == "proposal.failed":
                failing.append(event)
                counted += 1
            elif _is_kernel_failure(event.payload):
                # Older failing steps of a counted candidate are kept too: the first one is what it reports.
                failing.append(event)
                cid = str(event.payload.get("candidate_id", ""))
                counted += cid not in candidates
                candidates.add(cid)
        if len(page) < FAILURE_PAGE:
            break
        cursor = page[-1].stream_version
    proposals: list[RecordedEvent] = []
    if candidates:
        newest = max(e.stream_version for e in failing)
        rows = await store.pool.fetch(_PROPOSALS, stream_id, sorted(candidates), newest, len(candidates))
        proposals = [RecordedEvent.from_row(row) for row in rows]
    events = sorted([*failing, *proposals], key=lambda e: e.stream_version)
    return recent_failures_from_events(events, limit)


def _is_kernel_failure(payload: dict[str, Any]) -> bool:
    """Whether a step outcome's payload records a failure the kernel caused (not the harness's)."""
    output = payload.get("output", {})
    signal = (payload.get("evidence") or {}).get("signal")
    if output.get("verdict") in (None, "ok"):
        return False
    return is_kernel_outcome(str(output["verdict"]), signal if isinstance(signal, int) else None)


def recent_failures_from_events(events: list[RecordedEvent], limit: int = 5) -> list[RecentFailure]:
    """The newest ``limit`` failures of a search's event stream (all of it, or the part `read_recent_failures`
    selects: the same failures either way).

    Reads `candidate.proposed` for sources, the step outcomes (`candidate.compiled`, `…validated`,
    `…benchmarked`) for compile errors and failing cases, and `proposal.failed` for rejected replies
    (payload: ``ProposalFailure.model_dump``). A candidate appears once, at its first failing step.
    """
    sources: dict[str, tuple[str, str]] = {}
    found: list[RecentFailure] = []
    failed_ids: set[str] = set()
    for event in events:
        payload = event.payload
        if event.type == "candidate.proposed":
            candidate = payload.get("candidate", {})
            sources[candidate.get("candidate_id", "")] = (candidate.get("source", ""), candidate.get("label", ""))
        elif event.type in _STEP_STAGES:
            output = payload.get("output", {})
            cid = str(payload.get("candidate_id", ""))
            if cid in failed_ids or not _is_kernel_failure(payload):
                continue  # passed, reported already, or the harness failed (not the kernel): nothing to fix
            failed_ids.add(cid)
            source, label = sources.get(cid, ("", ""))
            evidence = payload.get("evidence") or {}
            generation = payload.get("generation")
            stage = _STEP_STAGES[event.type]
            if stage == "compile":
                found.append(failure_from_compile(cid, source, evidence, label=label, generation=generation))
            else:
                # A benchmark's evidence is {"reports": [...]}; the first report that is not ok tells why.
                reports = evidence.get("reports") if stage == "benchmark" else [evidence]
                bad = next((r for r in reports or [] if r.get("verdict") != "ok"), None)
                found.append(
                    failure_from_validation(
                        cid,
                        source,
                        bad or {"verdict": output.get("verdict"), "message": output.get("summary", "")},
                        stage=stage,
                        label=label,
                        generation=generation,
                    )
                )
        elif event.type == "proposal.failed":
            found.append(
                failure_from_rejected_reply(
                    str(payload.get("reason", "rejected")),
                    str(payload.get("message", "")),
                    str(payload.get("reply_excerpt", "")),
                    label=str(payload.get("label") or f"llm {payload.get('role', '')} {payload.get('model', '')}"),
                    generation=payload.get("generation"),
                )
            )
    return list(reversed(found))[:limit]
