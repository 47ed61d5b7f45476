"""Evidence export: one search's stream, or the whole log, written out with its hash chain for offline audit.

    async with await EventStore.connect(url) as store:
        with open("search.jsonl", "wb") as out:
            end = await export_evidence(store, JsonlSink(out), search_id="search-softmax-1a2b")

The export is read in one repeatable-read, read-only transaction: the header's counts and heads and the events
that follow come from the same snapshot of the log, however many appends commit meanwhile. The records and their
exact text are engine/evidence/export_format.py's; engine/evidence/offline_audit.py verifies a file without a
database. Parquet files are written by engine/evidence/export_parquet.py (imported only when asked for, since
pyarrow is slow to import).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import BinaryIO, Protocol

from engine.errors import NoEvents
from engine.evidence.events import StreamHead
from engine.evidence.export_format import (
    ExportDigest,
    ExportedEvent,
    ExportEnd,
    ExportHeader,
    canonical_line,
)
from engine.evidence.store import EventStore
from engine.search.history import stream_of

EXPORT_BATCH = 1000
"""Events fetched from the database, and handed to the sink, at a time."""


class ExportSink(Protocol):
    """Where an export's records go, in order: one header, event batches, one end record."""

    def header(self, header: ExportHeader) -> None:
        """The header, before any event."""

    def events(self, events: Sequence[ExportedEvent]) -> None:
        """The next events, in position order."""

    def end(self, end: ExportEnd) -> None:
        """The end record, after every event; the sink finishes its file here."""


class JsonlSink:
    """JSON Lines: every record as its canonical line (export_format.canonical_line), to a binary stream."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out

    def header(self, header: ExportHeader) -> None:
        self._out.write(canonical_line(header))

    def events(self, events: Sequence[ExportedEvent]) -> None:
        self._out.write(b"".join(canonical_line(event) for event in events))

    def end(self, end: ExportEnd) -> None:
        self._out.write(canonical_line(end))
        self._out.flush()


# The payload and metadata as their jsonb text, the one the hash covers (not decoded into Python values, whose
# numbers would lose their decimal text): see engine/evidence/event_hash.py.
_EVENT_COLUMNS = (
    "position, event_id, stream_id, stream_version, type, schema_version, payload::text AS payload, "
    "metadata::text AS metadata, recorded_at, prev_hash, hash"
)
_IN_SCOPE = "($1::text[] IS NULL OR stream_id = ANY($1::text[]))"

_SUMMARY = f"""
SELECT count(*) AS events, coalesce(min(position), 0) AS first_position, coalesce(max(position), 0) AS last_position,
       (SELECT position FROM event_log_head) AS log_committed
FROM events WHERE {_IN_SCOPE}
"""
_HEADS = f"""
SELECT DISTINCT ON (stream_id) stream_id, stream_version AS version, event_id, hash
FROM events WHERE {_IN_SCOPE}
ORDER BY stream_id, stream_version DESC
"""
_EVENTS = f"SELECT {_EVENT_COLUMNS} FROM events WHERE {_IN_SCOPE} ORDER BY position"


async def export_evidence(
    store: EventStore,
    sink: ExportSink,
    *,
    search_id: str | None = None,
    exported_at: datetime | None = None,
) -> ExportEnd:
    """Write the events of ``search_id``'s stream (None: of the whole log) to ``sink``, between a header and an
    end record, and return the end record. A search with no events is NoEvents (a UserError) naming it."""
    streams = None if search_id is None else [stream_of(search_id)]
    digest = ExportDigest()
    async with store.pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
        summary = await connection.fetchrow(_SUMMARY, streams)
        if search_id is not None and summary["events"] == 0:
            raise NoEvents(search_id)
        heads = await connection.fetch(_HEADS, streams)
        header = ExportHeader(
            exported_at=exported_at or datetime.now(UTC),
            search_id=search_id,
            events=summary["events"],
            first_position=summary["first_position"],
            last_position=summary["last_position"],
            log_committed=summary["log_committed"],
            streams=[StreamHead(**dict(row)) for row in heads],
        )
        digest.add(canonical_line(header))
        sink.header(header)
        written = 0
        cursor = connection.cursor(_EVENTS, streams, prefetch=EXPORT_BATCH)
        batch: list[ExportedEvent] = []
        async for row in cursor:
            event = ExportedEvent(**dict(row))
            digest.add(canonical_line(event))
            batch.append(event)
            if len(batch) == EXPORT_BATCH:
                sink.events(batch)
                written += len(batch)
                batch = []
        if batch:
            sink.events(batch)
            written += len(batch)
    end = ExportEnd(events=written, digest=digest.hexdigest())
    sink.end(end)
    return end
