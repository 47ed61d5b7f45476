"""A search rebuilt from its event log: what resume_from starts from and what `kf audit` shows.

The event log, not Temporal's history, is the record: a search can be rebuilt after its workflow history is
gone (retention), on another cluster, or years later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.evidence.events import RecordedEvent
from engine.evidence.store import EventStore
from engine.search.state import Incumbent

STEP_EVENTS = ("candidate.compiled", "candidate.validated", "candidate.benchmarked")


def stream_of(search_id: str) -> str:
    """The event stream of a search."""
    return f"search-{search_id}"


@dataclass
class CandidateRecord:
    """Everything the log holds about one candidate of a search."""

    candidate_id: str
    label: str = ""
    generation: int | None = None
    proposer: str = ""
    parent_id: str | None = None
    tags: list[str] = field(default_factory=list)
    steps: dict[str, RecordedEvent] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """The verdict of the last step reached."""
        for step in reversed(STEP_EVENTS):
            if step in self.steps:
                return str(self.steps[step].payload.get("output", {}).get("verdict", "?"))
        return "proposed"


@dataclass
class SearchHistory:
    """A search as its event log tells it."""

    search_id: str
    events: list[RecordedEvent]
    started: RecordedEvent | None = None
    finished: RecordedEvent | None = None
    incumbent: Incumbent | None = None
    candidates: dict[str, CandidateRecord] = field(default_factory=dict)
    promotions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def evaluated_ids(self) -> list[str]:
        """Candidates with at least one recorded step outcome, in order of first appearance."""
        return [cid for cid, rec in self.candidates.items() if rec.steps]


def rebuild(search_id: str, events: list[RecordedEvent]) -> SearchHistory:
    """Fold a search's events into its history."""
    history = SearchHistory(search_id=search_id, events=events)
    for event in events:
        payload = event.payload
        if event.type == "search.started":
            history.started = event
        elif event.type == "search.finished":
            history.finished = event
        elif event.type == "candidate.proposed":
            candidate = payload["candidate"]
            record = history.candidates.setdefault(
                candidate["candidate_id"], CandidateRecord(candidate["candidate_id"])
            )
            record.label = candidate.get("label", "")
            record.generation = payload.get("generation")
            record.proposer = candidate.get("proposer", "")
            record.parent_id = candidate.get("parent_id")
            record.tags = list(candidate.get("tags", []))
        elif event.type in STEP_EVENTS:
            cid = payload["candidate_id"]
            record = history.candidates.setdefault(cid, CandidateRecord(cid))
            record.generation = payload.get("generation", record.generation)
            record.steps[event.type] = event
        elif event.type == "incumbent.promoted":
            history.incumbent = Incumbent.model_validate(payload["incumbent"])
            history.promotions.append(payload)
            record = history.candidates.setdefault(
                history.incumbent.candidate.candidate_id,
                CandidateRecord(history.incumbent.candidate.candidate_id),
            )
            record.label = record.label or history.incumbent.candidate.label
            record.proposer = record.proposer or history.incumbent.candidate.proposer
    return history


async def load_search_history(store: EventStore, search_id: str) -> SearchHistory:
    """Read a search's stream and rebuild it."""
    return rebuild(search_id, await store.read_stream(stream_of(search_id)))
