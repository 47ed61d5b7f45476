"""A search rebuilt from its event log: what resume_from (or resume_latest) starts from and what `kf audit` shows.

The event log, not Temporal's history, is the record: a search can be rebuilt after its workflow history is
gone (retention), on another cluster, or years later.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from engine.evidence.events import RecordedEvent
from engine.evidence.store import EventStore
from engine.outages import is_kernel_outcome
from engine.search.state import Incumbent

STEP_EVENTS = ("candidate.compiled", "candidate.validated", "candidate.benchmarked")
RETIMING_EVENTS = {"candidate.remeasured": "remeasured", "search.playoff_round": "playoff"}
"""Timings of a candidate after its benchmark step, by event type, with the step name an audit gives them."""
NOT_JUDGED = ("harness_error", "unfinished", "proposed")
"""What CandidateRecord.verdict says of a candidate without a verdict: the harness or the infrastructure failed
past its retries; the record stops at an ok step short of the benchmark; no step was recorded."""


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
    harness_error: RecordedEvent | None = None
    """The ``candidate.harness_error`` event, when the harness or the infrastructure failed to judge it."""
    retimings: list[RecordedEvent] = field(default_factory=list)
    """Its timings after the benchmark step, in log order: re-measurements of a shaky reading
    (``candidate.remeasured``) and final playoff rounds it played as the challenger (``search.playoff_round``).
    Readings of a kernel already judged, never a verdict."""

    @property
    def verdict(self) -> str:
        """The kernel's verdict: the first step outcome that was not ok, or ok once the benchmark was. Without
        one, a value of NOT_JUDGED: ``harness_error`` (also for a step outcome an older log recorded from a
        sandbox killed from outside), ``unfinished`` or ``proposed`` -- never the ok of a step short of the end."""
        for step in STEP_EVENTS:
            event = self.steps.get(step)
            if event is None:
                break
            verdict = str(event.payload.get("output", {}).get("verdict", "?"))
            signal = (event.payload.get("evidence") or {}).get("signal")
            if not is_kernel_outcome(verdict, signal if isinstance(signal, int) else None):
                return "harness_error"
            if verdict != "ok":
                return verdict
        else:
            return "ok"
        if self.harness_error is not None:
            return "harness_error"
        return "unfinished" if self.steps else "proposed"


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
    playoff: RecordedEvent | None = None
    """The ``search.playoff`` event: the final playoff's rounds and winner, when the search held one."""

    @property
    def evaluated_ids(self) -> list[str]:
        """Candidates with at least one recorded step outcome, in order of first appearance."""
        return [cid for cid, rec in self.candidates.items() if rec.steps]

    @property
    def verdict_counts(self) -> dict[str, int]:
        """Candidates per kernel verdict, as the log tells it; those without one (NOT_JUDGED) are not counted."""
        counts = Counter(rec.verdict for rec in self.candidates.values())
        return {verdict: n for verdict, n in sorted(counts.items()) if verdict not in NOT_JUDGED}

    @property
    def harness_errors(self) -> list[str]:
        """Candidates the harness or the infrastructure failed to judge."""
        return [cid for cid, rec in self.candidates.items() if rec.verdict == "harness_error"]

    @property
    def timings(self) -> list[RecordedEvent]:
        """Every timing the log holds, candidate by candidate: its benchmark step, then its re-measurements and
        the playoff rounds it played (the timings a search's result counts)."""
        found: list[RecordedEvent] = []
        for record in self.candidates.values():
            benchmarked = record.steps.get("candidate.benchmarked")
            found += ([benchmarked] if benchmarked is not None else []) + record.retimings
        return found


def was_busy(event: RecordedEvent) -> bool:
    """Whether a timing's cores ran other work while it timed (its output's ``shared_cores``); False for an event
    of any other shape (an older kf's, or a hand's)."""
    output = event.payload.get("output")
    return isinstance(output, dict) and bool(output.get("shared_cores"))


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
        elif event.type in RETIMING_EVENTS:
            cid = payload["candidate_id"]
            history.candidates.setdefault(cid, CandidateRecord(cid)).retimings.append(event)
        elif event.type == "search.playoff":
            history.playoff = event
        elif event.type == "candidate.harness_error":
            cid = payload["candidate_id"]
            record = history.candidates.setdefault(cid, CandidateRecord(cid))
            record.generation = payload.get("generation", record.generation)
            record.harness_error = event
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


async def was_started(store: EventStore, search_id: str) -> bool:
    """True when the event log holds the search.started event of ``search_id``: a search that `resume_from` can
    start from (the start step refuses any other, as this says before a search is started)."""
    found: bool = await store.pool.fetchval(
        "SELECT EXISTS (SELECT 1 FROM events WHERE stream_id = $1 AND type = 'search.started')", stream_of(search_id)
    )
    return found


async def load_search_history(store: EventStore, search_id: str) -> SearchHistory:
    """Read a search's stream and rebuild it."""
    return rebuild(search_id, await store.read_stream(stream_of(search_id)))


async def best_incumbent_search(store: EventStore, problem: str, target: str, exclude: str) -> str | None:
    """The id of the search, other than ``exclude``, whose incumbent is the fastest (the highest speedup over
    numpy any of its promotions recorded; the later promotion on a tie) among the searches whose spec named
    this ``problem`` and ``target`` (as written); None when none has promoted anything. What a `resume_best`
    search starts from. Speedups recorded on other days are compared as recorded: the incumbent is timed
    again as the new search's generation 0."""
    stream: str | None = await store.pool.fetchval(
        """
        SELECT promoted.stream_id FROM events AS promoted
        WHERE promoted.type = 'incumbent.promoted' AND promoted.stream_id <> $3
          AND jsonb_typeof(promoted.payload -> 'incumbent' -> 'speedup') = 'number'
          AND EXISTS (
            SELECT 1 FROM events AS started
            WHERE started.stream_id = promoted.stream_id AND started.type = 'search.started'
              AND started.payload -> 'spec' ->> 'problem' = $1 AND started.payload -> 'spec' ->> 'target' = $2
          )
        ORDER BY (promoted.payload -> 'incumbent' ->> 'speedup')::float8 DESC, promoted.position DESC
        LIMIT 1
        """,
        problem,
        target,
        stream_of(exclude),
    )
    return None if stream is None else stream.removeprefix("search-")


async def latest_incumbent_search(store: EventStore, problem: str, target: str, exclude: str) -> str | None:
    """The id of the search, other than ``exclude``, whose incumbent was promoted last among the searches whose
    spec named this ``problem`` and ``target`` (as written: `cpu` and `cpu-x86_64-avx512` are two targets
    here); None when no such search has promoted anything. What a `resume_latest` search starts from."""
    # Ordered by the promotion's position, not the search's start: a long search that promoted after a
    # shorter, later one holds the newer incumbent.
    stream: str | None = await store.pool.fetchval(
        """
        SELECT promoted.stream_id FROM events AS promoted
        WHERE promoted.type = 'incumbent.promoted' AND promoted.stream_id <> $3
          AND EXISTS (
            SELECT 1 FROM events AS started
            WHERE started.stream_id = promoted.stream_id AND started.type = 'search.started'
              AND started.payload -> 'spec' ->> 'problem' = $1 AND started.payload -> 'spec' ->> 'target' = $2
          )
        ORDER BY promoted.position DESC
        LIMIT 1
        """,
        problem,
        target,
        stream_of(exclude),
    )
    return None if stream is None else stream.removeprefix("search-")
