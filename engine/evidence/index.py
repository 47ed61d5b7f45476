"""Evidence reuse: a candidate's compile and validation outcome recorded by an earlier search.

A candidate is its content (source and flags), so its compile verdict and its correctness on a target,
judged under one problem definition, are facts that do not change: a later search on the same target
reuses them instead of compiling and validating again. Only the benchmark is always repeated, because it
compares against the incumbent of the moment.

The index is the ``candidate_evidence`` table, kept by the lessons projection
(engine/evidence/lessons_projection.py) from the first compile and validation outcome of each candidate per
(target, problem fingerprint). Only a kernel's verdicts are evidence: an infrastructure failure (``harness_error``)
is never indexed, and one a view built before that rule still holds is never served.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from engine.evidence.lessons_projection import catch_up_lessons
from engine.evidence.store import EventStore
from engine.search.history import stream_of


class RecordedEvidence(BaseModel):
    """The first recorded compile and validation outcome of a candidate on a target."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    candidate_id: str
    """The candidate's content hash."""
    target: str
    """The resolved target the outcome was recorded on."""
    problem_fingerprint: str
    """Hash of the problem folder's files that judged it."""
    problem: str
    """The problem."""
    stream_id: str
    """Stream of the search that recorded the compile outcome."""
    compile_verdict: str | None
    """ok or compile_error; None when only a validation is known (never, in practice)."""
    artifact_id: str | None
    """The artifact built, when it compiled."""
    compile_summary: str
    """One line: the first compile error or the artifact."""
    compile_event_id: str | None
    """Event id of the original compile outcome."""
    compile_position: int | None
    """Its position in the log."""
    validation_verdict: str | None
    """Verdict of the original validation, or None when it was never validated."""
    validated_artifact_id: str | None
    """The artifact that validation judged."""
    validation_summary: str
    """One line: the first failing case or the number of trials."""
    validation_event_id: str | None
    """Event id of the original validation outcome."""
    validation_position: int | None
    """Its position in the log."""

    def reference(self, step: Literal["compile", "validation"]) -> dict[str, Any]:
        """The evidence a reusing step records: where the original outcome is, not a copy of it."""
        if step == "compile":
            event_id, position, verdict = self.compile_event_id, self.compile_position, self.compile_verdict
        else:
            event_id, position, verdict = self.validation_event_id, self.validation_position, self.validation_verdict
        return {
            "reused_from": {
                "event_id": event_id,
                "position": position,
                "stream_id": self.stream_id,
                "verdict": verdict,
                "target": self.target,
                "problem_fingerprint": self.problem_fingerprint,
            }
        }


async def recorded_evidence(
    store: EventStore, search_id: str, candidate_id: str, *, catch_up: bool = True
) -> RecordedEvidence | None:
    """The candidate's recorded evidence on the target and problem definition of ``search_id``, or None.

    Catches the lessons projection up first (cheap when it is current), so an outcome appended by any
    earlier search is found. None also when the search itself is not in the view yet (no target)."""
    if catch_up:
        await catch_up_lessons(store)
    row = await store.pool.fetchrow(
        """
        SELECT e.* FROM lesson_searches AS s
        JOIN candidate_evidence AS e
          ON e.target = s.target AND e.problem_fingerprint = s.problem_fingerprint AND e.candidate_id = $2
        WHERE s.stream_id = $1
        """,
        stream_of(search_id),
        candidate_id,
    )
    if row is None:
        return None
    fields = dict(row)
    for step in ("compile", "validation"):
        if fields[f"{step}_verdict"] == "harness_error":
            # Folded before the projection skipped infrastructure failures: no fact about the kernel.
            fields[f"{step}_verdict"] = fields[f"{step}_event_id"] = fields[f"{step}_position"] = None
    return RecordedEvidence(**fields)


async def recorded_payload(store: EventStore, event_id: str) -> dict[str, Any] | None:
    """The payload of the event stored under ``event_id``, or None (one indexed lookup)."""
    payload: dict[str, Any] | None = await store.pool.fetchval(
        "SELECT payload FROM events WHERE event_id = $1", event_id
    )
    return payload
