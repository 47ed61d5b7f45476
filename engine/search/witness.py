"""How a search's event stream is checked against a witness kept outside the database.

The database can stop its application role from rewriting the log, not its owner: an owner can remove a
stream's newest events, or change one and recompute the hash chain from there, and the chain still verifies.
So every step of a search returns its stream's head (version, event id, hash) to the workflow, and Temporal
keeps it in the search's history: activity results, the state carried across continue-as-new, and the
workflow's result. Because each hash covers every earlier event of the stream, one recorded head vouches
for the whole stream up to it, and a rewrite or a truncation is found and located unless Temporal's
history is forged too.

Fetching the history is Temporal's business (activities/witness.py); this module only compares.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.evidence.events import RecordedEvent, StreamHead


class WitnessedHead(BaseModel):
    """One head the witness recorded, and where."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    head: StreamHead
    """The stream's head as the step that appended (or found) its event reported it."""
    source: str
    """Where the witness holds it, for people: e.g. ``activity kf.compile (run 3f9c1a2b, history event 42)``."""


class Witness(BaseModel):
    """What a search's Temporal history says about its event stream."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    search_id: str
    """The search (workflow) id."""
    available: bool
    """False when there is no history to compare with (deleted after retention, another cluster, Temporal
    unreachable); ``reason`` says which."""
    reason: str = ""
    """Why the witness is unavailable, or what is missing from it (earlier runs already deleted)."""
    transient: bool = False
    """True when it is unavailable because Temporal did not answer: asked again later, it may be read. False when
    the history is gone for good (retention, another cluster) or was read."""
    source: str = ""
    """Which history was read, for people."""
    heads: list[WitnessedHead] = Field(default_factory=list)
    """Every head the history recorded, in history order."""
    final: WitnessedHead | None = None
    """The head in the completed workflow's result: nothing may follow it in the stream. None while the
    search runs, and when it failed or was terminated (a step may still have been writing)."""

    @property
    def usable(self) -> bool:
        """True when there is at least one head to compare with."""
        return self.available and bool(self.heads or self.final)


class WitnessFinding(BaseModel):
    """A difference between the stream and its witness, located as closely as the witness allows."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    problem: Literal["rewritten", "missing", "appended_after_finish"]
    """rewritten: a stored event's hash (or id) is not the one recorded; missing: the stream ends before a
    recorded head (its newest events were removed); appended_after_finish: events follow the head the
    finished search returned."""
    first_version: int
    """First stream version concerned."""
    last_version: int
    """Last stream version concerned (the same when the witness pins one event)."""
    event_ids: list[str]
    """The events concerned: stored ones for a rewrite, recorded ones for missing events."""
    message: str
    """What was found, naming the events, the hashes and the witness's source."""


def check_witness(events: list[RecordedEvent], witness: Witness, stream_id: str) -> list[WitnessFinding]:
    """Compare a stream's stored events (in version order) with the heads its witness recorded.

    Finds the first rewritten stretch (between the last recorded head that still matches and the first that
    does not), a truncated stream (recorded heads past its end) and events after the final head."""
    stored = {event.stream_version: event for event in events if event.stream_id == stream_id}
    last = max(stored, default=0)
    recorded = [w for w in witness.heads if w.head.stream_id == stream_id]
    if witness.final is not None and witness.final.head.stream_id == stream_id:
        recorded.append(witness.final)
    recorded.sort(key=lambda w: w.head.version)
    findings: list[WitnessFinding] = []

    matched = 0
    for witnessed in recorded:
        head = witnessed.head
        event = stored.get(head.version)
        if event is None:
            continue
        if event.hash == head.hash and event.event_id == head.event_id:
            matched = head.version
            continue
        # The chain ties every head to all events before it: the change lies after the last head that still
        # matches and at or before this one.
        stretch = [stored[v] for v in range(matched + 1, head.version + 1) if v in stored]
        if len(stretch) == 1:
            what = f"event {event.event_id!r} (v{head.version}) was changed"
        else:
            names = ", ".join(f"{e.event_id!r} (v{e.stream_version})" for e in stretch)
            what = f"one of events v{matched + 1}..v{head.version} was changed and the chain re-hashed from it: {names}"
        findings.append(
            WitnessFinding(
                problem="rewritten",
                first_version=matched + 1,
                last_version=head.version,
                event_ids=[e.event_id for e in stretch],
                message=(
                    f"{what}. Temporal recorded {head.event_id!r} with hash {head.hash[:16]}… at v{head.version} "
                    f"({witnessed.source}); the log holds {event.event_id!r} with hash {event.hash[:16]}…"
                ),
            )
        )
        break

    beyond = [w for w in recorded if w.head.version > last]
    if beyond:
        newest = beyond[-1]
        named = list(dict.fromkeys(w.head.event_id for w in beyond))
        findings.append(
            WitnessFinding(
                problem="missing",
                first_version=last + 1,
                last_version=newest.head.version,
                event_ids=named,
                message=(
                    f"the stream ends at v{last} but Temporal recorded it up to v{newest.head.version} "
                    f"({newest.source}): versions {last + 1}..{newest.head.version} were removed, among them "
                    + ", ".join(f"{w.head.event_id!r} (v{w.head.version})" for w in beyond[-5:])
                ),
            )
        )

    if witness.final is not None and witness.final.head.stream_id == stream_id and last > witness.final.head.version:
        extra = [stored[v] for v in range(witness.final.head.version + 1, last + 1) if v in stored]
        findings.append(
            WitnessFinding(
                problem="appended_after_finish",
                first_version=witness.final.head.version + 1,
                last_version=last,
                event_ids=[e.event_id for e in extra],
                message=(
                    f"the search finished at v{witness.final.head.version} ({witness.final.source}) but the stream "
                    f"goes on to v{last}: " + ", ".join(f"{e.event_id!r} (v{e.stream_version})" for e in extra[:5])
                ),
            )
        )
    return findings
