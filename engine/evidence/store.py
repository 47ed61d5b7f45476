"""The event store: append, read and verify the evidence log in Postgres (asyncpg).

The guarantees live in the database (migrations/0001_event_store.sql, 0005_log_roles_and_positions.sql):
positions in commit order without gaps, never reused, with the highest one committed kept apart from the
events; contiguous stream versions; the per-stream sha-256 chain; refusal of UPDATE/DELETE/TRUNCATE; and an
application role that may only insert and select. This module adds what needs the caller's intent:

- idempotency: an event id already stored with the same content (stream, type, schema version, payload)
  returns the stored event and writes nothing; the same id with other content is an IdempotencyConflict.
  Metadata is not compared: a retry from attempt 2 records the same fact as attempt 1.
- optimistic concurrency: ``expected_version`` must equal the stream's version or ConcurrencyError.
- atomic batches: all events of one append are stored, or none.
- size: payloads (and metadata) over MAX_PAYLOAD_BYTES of JSON are refused with PayloadTooLarge
  before anything is sent. Bulk content belongs in the content-addressed store; an event carries its hash.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import asyncpg
import pydantic_core
from pydantic import BaseModel, ConfigDict

from engine.database_url import connect, create_pool
from engine.errors import (
    ConcurrencyError,
    IdempotencyConflict,
    InvalidEvent,
    MigrationError,
    PayloadTooLarge,
)
from engine.evidence.events import GENESIS_HASH, RECORDED_COLUMNS, NewEvent, RecordedEvent
from engine.evidence.projections import ProjectionTransaction, projection

MAX_PAYLOAD_BYTES = 1024 * 1024
"""Largest payload (and metadata) of one event, in bytes of JSON. Mirrors kf_max_payload_bytes() in
migrations/0001_event_store.sql, which enforces it for every writer."""

APPEND_LOCK_KEY = 7171001
"""Transaction-level advisory lock that serialises appends; the insert trigger takes the same key."""

NOTIFY_CHANNEL = "kf_events"
"""Channel the insert trigger notifies (with the newest position) when appends commit."""

_WAKE_UP_SLICE_S = 1.0
"""Longest a waiter sleeps before re-reading the position, in case a notification was lost."""


class BrokenLink(BaseModel):
    """The first event at which the log's integrity checks fail."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    position: int
    """Global position of the offending event."""
    event_id: str
    """Its event id."""
    stream_id: str
    """Its stream."""
    stream_version: int
    """Its version in the stream."""
    problem: Literal["hash_mismatch", "chain_broken", "version_gap", "position_gap"]
    """hash_mismatch: the stored content no longer hashes to the stored hash (it was changed);
    chain_broken: prev_hash is not the hash of the stream's previous event (one was changed, removed or
    replaced); version_gap: stream versions skip (events removed); position_gap: global positions skip
    (events removed; only checked when the whole log is verified)."""
    expected: str
    """What the check computed (hash, previous hash, version or position)."""
    actual: str
    """What is stored."""

    def __str__(self) -> str:
        where = f"event {self.event_id!r} (stream {self.stream_id!r} v{self.stream_version}, position {self.position})"
        return f"{where}: {self.problem.replace('_', ' ')}: expected {self.expected}, stored {self.actual}"


class EventRef(BaseModel):
    """Which event, in the words a report names it with."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    position: int
    """Its global position."""
    event_id: str
    """Its event id."""
    stream_id: str
    """Its stream."""
    stream_version: int
    """Its version in the stream."""

    def __str__(self) -> str:
        return f"event {self.event_id!r} (stream {self.stream_id!r} v{self.stream_version}, position {self.position})"


class PositionGap(BaseModel):
    """Committed positions that no stored event holds: events were removed from the log."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    first: int
    """First missing position."""
    last: int
    """Last missing position."""
    before: EventRef | None
    """The stored event just before the gap; None when the gap starts at position 1."""
    after: EventRef | None
    """The stored event just after it; None when the gap is the log's tail (the newest events are gone)."""

    def __str__(self) -> str:
        which = f"position {self.first}" if self.first == self.last else f"positions {self.first}..{self.last}"
        where = [f"after {self.before}" if self.before else "at the start of the log"]
        where.append(f"before {self.after}" if self.after else "at the tail: the log's newest events are gone")
        return f"{which} missing, {', '.join(where)}"


class LogPositions(BaseModel):
    """The whole log's positions, checked against the highest position ever committed (not max(position),
    which forgets a removed tail)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    events: int
    """Stored events."""
    stored: int
    """Highest stored position (0 for an empty log)."""
    committed: int
    """Highest position ever committed, kept by the insert trigger apart from the events (event_log_head)."""
    issued: int
    """Highest position the sequence issued. Above ``committed`` by the numbers of appends in flight or
    rolled back (the next append reuses them); below it only when someone set the sequence back."""
    gaps: list[PositionGap]
    """Missing positions in order, the tail last (at most the first ``limit`` asked for)."""
    gaps_total: int
    """How many gaps there are in all."""

    @property
    def sequence_set_back(self) -> bool:
        """True when the sequence is behind the committed head: only a hand can do that."""
        return self.issued < self.committed

    @property
    def intact(self) -> bool:
        """No missing position and no counter set back."""
        return self.gaps_total == 0 and not self.sequence_set_back


@dataclass(frozen=True)
class _Prepared:
    """A NewEvent with its JSON encoded once: for the size check, the insert and the content comparison."""

    event: NewEvent
    payload_json: str
    metadata_json: str


_SERVER_SETTINGS = {
    # asyncpg prepares every query and keeps it for the connection's life; after five runs Postgres may
    # switch to a generic plan chosen for the table as it was then. A store that starts on a nearly
    # empty log would keep sequential-scan plans (for `event_id = ANY($2)`, say) while the log grows to
    # millions of events. Planning each execution costs ~0.1 ms and keeps every lookup an index probe.
    "plan_cache_mode": "force_custom_plan",
}


async def _init_connection(connection: asyncpg.Connection) -> None:
    # jsonb comes back as Python objects, parsed by pydantic-core (several times faster than the json
    # module: decoding payloads is most of the cost of reading the log). Parameters are sent as text and
    # cast in SQL, so the encoder only matters for callers that pass jsonb values themselves.
    await connection.set_type_codec(
        "jsonb", encoder=_dump_json, decoder=pydantic_core.from_json, schema="pg_catalog", format="text"
    )


def _dump_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, allow_nan=False)


_APPEND_CHECK = f"""
SELECT current.version AS current_version, {", ".join(f"stored.{c}" for c in RecordedEvent.model_fields)}
FROM (SELECT coalesce(max(stream_version), 0) AS version FROM events WHERE stream_id = $1) AS current
LEFT JOIN events AS stored ON stored.event_id = ANY($2::text[])
"""

# One statement for the whole batch; the insert trigger assigns position, recorded_at and the hashes.
# WITH ORDINALITY + ORDER BY keep the batch's order, so stream versions follow it.
_APPEND_INSERT = f"""
INSERT INTO events (event_id, stream_id, stream_version, type, schema_version, payload, metadata)
SELECT e.event_id, $1, $2 + e.n, e.type, e.schema_version, e.payload::jsonb, e.metadata::jsonb
FROM unnest($3::text[], $4::text[], $5::int[], $6::text[], $7::text[])
     WITH ORDINALITY AS e(event_id, type, schema_version, payload, metadata, n)
ORDER BY e.n
RETURNING {RECORDED_COLUMNS}
"""

_VERIFY = f"""
SELECT position, event_id, stream_id, stream_version, prev_hash, hash, recomputed,
       previous_hash, previous_version, previous_position
FROM (
    SELECT position, event_id, stream_id, stream_version, prev_hash, hash,
           kf_event_hash(position, event_id, stream_id, stream_version, type, schema_version,
                         payload, metadata, recorded_at, prev_hash) AS recomputed,
           lag(hash) OVER per_stream AS previous_hash,
           lag(stream_version) OVER per_stream AS previous_version,
           lag(position) OVER log AS previous_position
    FROM events
    WHERE $1::text IS NULL OR stream_id = $1
    WINDOW per_stream AS (PARTITION BY stream_id ORDER BY stream_version), log AS (ORDER BY position)
) AS checked
WHERE hash IS DISTINCT FROM recomputed
   OR prev_hash IS DISTINCT FROM coalesce(previous_hash, '{GENESIS_HASH}')
   OR stream_version <> coalesce(previous_version, 0) + 1
   OR ($1::text IS NULL AND $2 AND position <> coalesce(previous_position, 0) + 1)
ORDER BY position
LIMIT 1
"""

_COUNTERS = """
SELECT (SELECT count(*) FROM events) AS events,
       (SELECT coalesce(max(position), 0) FROM events) AS stored,
       (SELECT position FROM event_log_head) AS committed,
       (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM events_position) AS issued
"""

_REF_COLUMNS = ("position", "event_id", "stream_id", "stream_version")

# Every hole between stored positions, with the events on both sides: one pass over the primary key.
_GAPS = f"""
WITH gaps AS (
    SELECT previous, position
    FROM (SELECT position, lag(position) OVER (ORDER BY position) AS previous FROM events) AS g
    WHERE position <> coalesce(previous, 0) + 1
)
SELECT coalesce(gaps.previous, 0) + 1 AS first, gaps.position - 1 AS last, count(*) OVER () AS total,
       {", ".join(f"b.{c} AS before_{c}" for c in _REF_COLUMNS)},
       {", ".join(f"a.{c} AS after_{c}" for c in _REF_COLUMNS)}
FROM gaps
JOIN events AS a ON a.position = gaps.position
LEFT JOIN events AS b ON b.position = gaps.previous
ORDER BY gaps.position
LIMIT $1
"""


class EventStore:
    """The evidence log in Postgres. Create with :meth:`connect`; close with :meth:`close` (or use it as
    an async context manager)."""

    def __init__(self, pool: asyncpg.Pool, database_url: str) -> None:
        self._pool = pool
        self._database_url = database_url
        self._listener: asyncpg.Connection | None = None
        self._listener_lock = asyncio.Lock()
        self._wake_up = asyncio.Event()

    @classmethod
    async def connect(cls, database_url: str, *, min_size: int = 1, max_size: int = 10) -> EventStore:
        """Open a pool on a migrated database (``kf db migrate``); clear errors for a bad URL or schema."""
        pool = await create_pool(
            database_url,
            min_size=min_size,
            max_size=max_size,
            init=_init_connection,
            server_settings=_SERVER_SETTINGS,
        )
        if await pool.fetchval("SELECT to_regclass('events') IS NULL"):
            await pool.close()
            raise MigrationError(
                "the database has no events table: apply the migrations first with `kf db migrate` "
                "(or engine.evidence.migrations.migrate(url))"
            )
        return cls(pool, database_url)

    @property
    def pool(self) -> asyncpg.Pool:
        """The connection pool, for projections and tools that query the log's tables directly."""
        return self._pool

    async def close(self) -> None:
        """Close the wake-up listener and the pool."""
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        await self._pool.close()

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- writing -----------------------------------------------------------------------------------

    async def append(
        self, stream_id: str, events: Sequence[NewEvent], expected_version: int | None = None
    ) -> list[RecordedEvent]:
        """Append ``events`` to ``stream_id`` atomically and return them as stored.

        ``expected_version`` (0 for a new stream) makes the append conditional on the stream's current
        version. When every event id is already stored with the same content (a retry), the stored events
        are returned and nothing is written, whatever ``expected_version`` says.
        """
        if not stream_id:
            raise InvalidEvent("stream_id must be a non-empty string")
        prepared = [_prepare(event) for event in events]
        ids = [p.event.event_id for p in prepared]
        if len(set(ids)) != len(ids):
            repeated = sorted({i for i in ids if ids.count(i) > 1})
            raise InvalidEvent(f"event ids {repeated} appear more than once in one append to {stream_id!r}")
        async with self._pool.acquire() as connection, connection.transaction():
            # Taken before reading anything, in its own statement: the reads below then see every
            # append that committed before ours, so neither the idempotency check nor the version check
            # can race with a concurrent append of the same ids or the same stream. (A lock taken inside
            # the reading statement would come after that statement's snapshot.)
            await connection.execute("SELECT pg_advisory_xact_lock($1)", APPEND_LOCK_KEY)
            rows = await connection.fetch(_APPEND_CHECK, stream_id, ids)
            current = int(rows[0]["current_version"])
            stored = {row["event_id"]: RecordedEvent.from_row(row) for row in rows if row["position"] is not None}
            if stored:
                return _replayed(stream_id, prepared, stored)
            if expected_version is not None and expected_version != current:
                raise ConcurrencyError(
                    f"stream {stream_id!r} is at version {current}, not the expected {expected_version}: "
                    "another writer appended first; re-read the stream and decide again",
                    stream_id=stream_id,
                    expected=expected_version,
                    actual=current,
                )
            if not prepared:
                return []
            try:
                inserted = await connection.fetch(
                    _APPEND_INSERT,
                    stream_id,
                    current,
                    ids,
                    [p.event.type for p in prepared],
                    [p.event.schema_version for p in prepared],
                    [p.payload_json for p in prepared],
                    [p.metadata_json for p in prepared],
                )
            except asyncpg.PostgresError as error:
                if getattr(error, "sqlstate", None) == "KF002":
                    # The database's limit is on jsonb's own text, a little longer than compact JSON.
                    message = getattr(error, "message", None) or str(error)
                    raise PayloadTooLarge(f"{message} (as jsonb text): {_BULK_FIX}") from error
                raise
        return sorted((RecordedEvent.from_row(row) for row in inserted), key=lambda e: e.position)

    # -- reading -----------------------------------------------------------------------------------

    async def read_stream(self, stream_id: str, from_version: int = 1) -> list[RecordedEvent]:
        """The stream's events from ``from_version`` on, in version order."""
        rows = await self._pool.fetch(
            f"SELECT {RECORDED_COLUMNS} FROM events WHERE stream_id = $1 AND stream_version >= $2 "
            "ORDER BY stream_version",
            stream_id,
            from_version,
        )
        return [RecordedEvent.from_row(row) for row in rows]

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[RecordedEvent]:
        """Up to ``limit`` events after ``after_position``, in position order. Tail the log by passing the
        last position seen: positions become visible strictly in order, so nothing is ever skipped."""
        rows = await self._pool.fetch(
            f"SELECT {RECORDED_COLUMNS} FROM events WHERE position > $1 ORDER BY position LIMIT $2",
            after_position,
            limit,
        )
        return [RecordedEvent.from_row(row) for row in rows]

    async def read_event(self, event_id: str) -> RecordedEvent | None:
        """The event stored under ``event_id``, or None."""
        row = await self._pool.fetchrow(f"SELECT {RECORDED_COLUMNS} FROM events WHERE event_id = $1", event_id)
        return None if row is None else RecordedEvent.from_row(row)

    async def stream_version(self, stream_id: str) -> int:
        """The stream's current version; 0 for a stream with no events."""
        version: int = await self._pool.fetchval(
            "SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = $1", stream_id
        )
        return version

    async def last_position(self) -> int:
        """Position of the newest event; 0 for an empty log."""
        position: int = await self._pool.fetchval("SELECT coalesce(max(position), 0) FROM events")
        return position

    async def streams(self, prefix: str = "") -> list[str]:
        """Ids of the streams that start with ``prefix``, sorted bytewise."""
        rows = await self._pool.fetch(
            "SELECT DISTINCT stream_id FROM events WHERE starts_with(stream_id, $1) ORDER BY stream_id",
            prefix,
        )
        return [row["stream_id"] for row in rows]

    async def wait_for_events(self, after_position: int, timeout: float) -> bool:
        """Wait until the log holds an event after ``after_position``; False if ``timeout`` seconds pass.

        LISTEN/NOTIFY is only the wake-up: the answer always comes from re-reading the newest position,
        so a lost or merged notification can delay a waiter by at most a second, never mislead it.
        """
        await self._ensure_listener()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            # Take the current wake-up event BEFORE reading: a commit after the read sets this event.
            wake_up = self._wake_up
            if await self.last_position() > after_position:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(wake_up.wait(), min(remaining, _WAKE_UP_SLICE_S))
            except TimeoutError:
                pass

    async def _ensure_listener(self) -> None:
        async with self._listener_lock:
            if self._listener is not None and not self._listener.is_closed():
                return
            # A connection of its own, outside the pool: it stays in LISTEN for the store's lifetime.
            self._listener = await connect(self._database_url)
            await self._listener.add_listener(NOTIFY_CHANNEL, self._on_notify)

    def _on_notify(self, connection: object, pid: int, channel: str, payload: object) -> None:
        # Wake every current waiter, and give later waiters a fresh event to wait on.
        woken, self._wake_up = self._wake_up, asyncio.Event()
        woken.set()

    # -- integrity ---------------------------------------------------------------------------------

    async def verify(self, stream_id: str | None = None, *, check_positions: bool = True) -> BrokenLink | None:
        """Recompute every hash of one stream (or of the whole log) in the database and check the chain
        links, versions and (whole log only, unless ``check_positions`` is False) positions. Returns the first
        broken link by position, or None when the log is intact. :meth:`positions` lists every missing
        position, the removed tail included."""
        row = await self._pool.fetchrow(_VERIFY, stream_id, check_positions)
        if row is None:
            return None
        common = {
            "position": row["position"],
            "event_id": row["event_id"],
            "stream_id": row["stream_id"],
            "stream_version": row["stream_version"],
        }
        if row["hash"] != row["recomputed"]:
            return BrokenLink(**common, problem="hash_mismatch", expected=row["recomputed"], actual=row["hash"])
        previous_hash = row["previous_hash"] or GENESIS_HASH
        if row["prev_hash"] != previous_hash:
            return BrokenLink(**common, problem="chain_broken", expected=previous_hash, actual=row["prev_hash"])
        expected_version = (row["previous_version"] or 0) + 1
        if row["stream_version"] != expected_version:
            return BrokenLink(
                **common,
                problem="version_gap",
                expected=str(expected_version),
                actual=str(row["stream_version"]),
            )
        return BrokenLink(
            **common,
            problem="position_gap",
            expected=str((row["previous_position"] or 0) + 1),
            actual=str(row["position"]),
        )

    async def positions(self, limit: int = 100) -> LogPositions:
        """Every hole in the log's positions (up to ``limit`` of them), the events around each, and a
        missing tail: the stored events checked against the highest position ever committed.

        Positions are gap-free in normal operation (migrations/0005 says how a rolled-back append's numbers
        are reused), so every hole is a removed event."""
        # One snapshot for the counters and the rows: an append committing between two reads would
        # otherwise look like a missing tail.
        async with self._pool.acquire() as connection, connection.transaction(isolation="repeatable_read"):
            counters = await connection.fetchrow(_COUNTERS)
            rows = await connection.fetch(_GAPS, limit)
            newest = await connection.fetchrow(
                f"SELECT {', '.join(_REF_COLUMNS)} FROM events WHERE position = $1", counters["stored"]
            )
        gaps = [
            PositionGap(
                first=row["first"],
                last=row["last"],
                before=_ref(row, "before_"),
                after=_ref(row, "after_"),
            )
            for row in rows
        ]
        total = int(rows[0]["total"]) if rows else 0
        committed, stored = int(counters["committed"]), int(counters["stored"])
        if committed > stored:
            total += 1
            if len(gaps) < limit:
                gaps.append(PositionGap(first=stored + 1, last=committed, before=_ref(newest, ""), after=None))
        return LogPositions(
            events=counters["events"],
            stored=stored,
            committed=committed,
            issued=counters["issued"],
            gaps=gaps,
            gaps_total=total,
        )

    # -- projections -------------------------------------------------------------------------------

    def projection(self, name: str) -> AbstractAsyncContextManager[ProjectionTransaction]:
        """A transaction in which projection ``name`` updates its view and its checkpoint together."""
        return projection(self._pool, name)


_BULK_FIX = "store bulk content content-addressed and put its hash in the event"


def _ref(row: asyncpg.Record | None, prefix: str) -> EventRef | None:
    if row is None or row[f"{prefix}position"] is None:
        return None
    return EventRef(**{c: row[f"{prefix}{c}"] for c in _REF_COLUMNS})


def _prepare(event: NewEvent) -> _Prepared:
    try:
        payload_json = json.dumps(event.payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        metadata_json = json.dumps(event.metadata, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise InvalidEvent(
            f"event {event.event_id!r} (type {event.type!r}) is not JSON: {error}; "
            "payloads and metadata hold JSON values only (no NaN or infinity)"
        ) from None
    if _has_nul(payload_json) or _has_nul(metadata_json):
        raise InvalidEvent(
            f"event {event.event_id!r} (type {event.type!r}) contains the NUL character \\u0000, which "
            "Postgres jsonb cannot store: remove it, or store the raw bytes content-addressed"
        )
    if not event.event_id or not event.type:
        raise InvalidEvent(f"event id {event.event_id!r} and type {event.type!r} must both be non-empty")
    for what, text in (("payload", payload_json), ("metadata", metadata_json)):
        size = len(text.encode())
        if size > MAX_PAYLOAD_BYTES:
            raise PayloadTooLarge(
                f"{what} of event {event.event_id!r} (type {event.type!r}) is {size} bytes of JSON, over the "
                f"limit of {MAX_PAYLOAD_BYTES} bytes (1 MiB): {_BULK_FIX}"
            )
    return _Prepared(event, payload_json, metadata_json)


_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""A JSON escape of the NUL character (not an escaped backslash followed by 'u0000')."""


def _has_nul(text: str) -> bool:
    return "\\u0000" in text and _JSON_NUL.search(text) is not None


def _replayed(stream_id: str, prepared: list[_Prepared], stored: dict[str, RecordedEvent]) -> list[RecordedEvent]:
    """The stored events for a retried append, or the conflict that makes it not a retry."""
    for p in prepared:
        event = p.event
        previous = stored.get(event.event_id)
        if previous is None:
            continue
        differences = [
            name
            for name, mine, theirs in (
                ("stream", stream_id, previous.stream_id),
                ("type", event.type, previous.type),
                ("schema_version", event.schema_version, previous.schema_version),
                ("payload", json.loads(p.payload_json), previous.payload),
            )
            if mine != theirs
        ]
        if differences:
            raise IdempotencyConflict(
                f"event id {event.event_id!r} is already stored (stream {previous.stream_id!r} "
                f"v{previous.stream_version}, position {previous.position}) with a different "
                f"{', '.join(differences)}: an event id names one fact; derive a new id for new content",
                event_id=event.event_id,
            )
    missing = [p.event.event_id for p in prepared if p.event.event_id not in stored]
    if missing:
        present = [p.event.event_id for p in prepared if p.event.event_id in stored]
        raise IdempotencyConflict(
            f"events {present} of this append to {stream_id!r} are already stored but {missing} are not: "
            "an append is all-or-nothing, so a retry must resend exactly the original batch",
            event_id=present[0],
        )
    return sorted((stored[p.event.event_id] for p in prepared), key=lambda e: e.position)
