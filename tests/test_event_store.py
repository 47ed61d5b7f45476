"""The event store against a real Postgres (pgserver).

``EventStoreContract`` states what every event store must guarantee (ordering, idempotency, conflicts,
atomic batches, concurrency, tailing, size limit, projections). A store implementation runs it by
subclassing it with a ``store`` fixture; ``TestPostgresEventStore`` does so for the asyncpg store and adds
what only the database itself can show (refused UPDATE/DELETE/TRUNCATE, tampering found by verify).
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import asyncpg
import pytest

from engine.errors import (
    ConcurrencyError,
    IdempotencyConflict,
    InvalidEvent,
    MigrationError,
    PayloadTooLarge,
)
from engine.evidence.events import (
    GENESIS_HASH,
    EventPayload,
    NewEvent,
    RawEvent,
    RecordedEvent,
    decode,
    event_type,
    to_new_event,
)
from engine.evidence.store import MAX_PAYLOAD_BYTES, EventStore


def new(event_id: str, type: str = "test.happened", **payload: Any) -> NewEvent:
    return NewEvent(event_id=event_id, type=type, payload=payload or {"id": event_id})


@event_type("test.candidate_compiled", schema_version=2)
class CandidateCompiled(EventPayload):
    candidate_id: str
    """Content hash of the candidate."""
    artifact: str
    """Content hash of the compiled artifact."""

    @classmethod
    def upcast(cls, payload: dict[str, Any], from_version: int) -> dict[str, Any]:
        # Version 1 called the artifact "binary".
        if from_version == 1:
            payload["artifact"] = payload.pop("binary")
        return payload


class EventStoreContract:
    """What every event store guarantees. Subclasses provide a ``store`` fixture with an empty log."""

    # -- appending and reading ---------------------------------------------------------------------

    async def test_append_assigns_positions_versions_and_a_hash_chain(self, store: EventStore) -> None:
        first = await store.append("search-1", [new("a1"), new("a2")], expected_version=0)
        other = await store.append("search-2", [new("b1")])
        more = await store.append("search-1", [new("a3")], expected_version=2)

        assert [e.position for e in first + other + more] == [1, 2, 3, 4]
        assert [e.stream_version for e in first + more] == [1, 2, 3]
        assert first[0].prev_hash == GENESIS_HASH == other[0].prev_hash
        assert first[1].prev_hash == first[0].hash and more[0].prev_hash == first[1].hash
        assert len({e.hash for e in first + other + more}) == 4
        assert await store.read_stream("search-1") == first + more
        assert await store.read_stream("search-1", from_version=2) == [first[1], *more]
        assert await store.read_all() == [first[0], first[1], other[0], more[0]]
        assert await store.read_all(after_position=2, limit=1) == other
        assert await store.stream_version("search-1") == 3
        assert await store.stream_version("nothing") == 0
        assert await store.verify() is None

    async def test_payload_metadata_and_types_round_trip(self, store: EventStore) -> None:
        payload = {"z": [1, 2.5, None, True], "a": {"nested": "ünïcode ✓"}, "n": 10**15}
        metadata = {"workflow_id": "kernel-search-1", "attempt": 1}
        event = NewEvent(event_id="e", type="t", payload=payload, metadata=metadata, schema_version=3)
        (stored,) = await store.append("s", [event])
        (read,) = await store.read_all()
        assert read == stored
        assert (read.payload, read.metadata, read.schema_version, read.type) == (payload, metadata, 3, "t")
        assert read.recorded_at.tzinfo is not None

    async def test_read_events_equal_validated_models(self, store: EventStore) -> None:
        (stored,) = await store.append("s", [new("v", value=[1, {"x": None}])])
        (read,) = await store.read_all()
        validated = RecordedEvent.model_validate(read.model_dump())
        assert read == validated == stored
        assert read.model_dump_json() == validated.model_dump_json()
        assert read.model_copy(update={"type": "other"}).type == "other"
        assert repr(read) == repr(validated)

    async def test_streams_lists_ids_by_prefix(self, store: EventStore) -> None:
        for stream in ["search/b", "search/a", "lessons/x", "search%_odd"]:
            await store.append(stream, [new(f"id-{stream}")])
        assert await store.streams() == ["lessons/x", "search%_odd", "search/a", "search/b"]
        assert await store.streams("search/") == ["search/a", "search/b"]
        assert await store.streams("search%") == ["search%_odd"]
        assert await store.streams("none") == []

    async def test_empty_append_checks_the_version_and_writes_nothing(self, store: EventStore) -> None:
        assert await store.append("s", [], expected_version=0) == []
        with pytest.raises(ConcurrencyError):
            await store.append("s", [], expected_version=3)
        assert await store.read_all() == []

    # -- idempotency -------------------------------------------------------------------------------

    async def test_a_retried_append_returns_the_stored_events_and_writes_nothing(self, store: EventStore) -> None:
        batch = [new("r1", value=1), new("r2", value=2)]
        stored = await store.append("s", batch, expected_version=0)
        await store.append("s", [new("r3")], expected_version=2)

        # A retry: same ids and content, a stale expected version, other metadata (attempt 2).
        retried = [e.model_copy(update={"metadata": {"attempt": 2}}) for e in batch]
        replayed = await store.append("s", retried, expected_version=0)
        assert [e.__dict__ for e in replayed] == [e.__dict__ for e in stored]  # the same fields, no more
        assert await store.append("s", batch) == stored
        assert [e.event_id for e in await store.read_all()] == ["r1", "r2", "r3"]
        assert (await store.read_all())[0].metadata == {}

    async def test_concurrent_identical_appends_store_one_event(self, store: EventStore) -> None:
        results = await asyncio.gather(*(store.append("s", [new("same", v=1)]) for _ in range(8)))
        assert all(result == results[0] for result in results)
        assert len(await store.read_all()) == 1

    async def test_other_content_under_a_stored_id_is_refused(self, store: EventStore) -> None:
        await store.append("s", [new("dup", value=1)])
        with pytest.raises(IdempotencyConflict, match=r"'dup'.*payload") as caught:
            await store.append("s", [new("dup", value=2)])
        assert caught.value.event_id == "dup"
        with pytest.raises(IdempotencyConflict, match=r"'dup'.*stream"):
            await store.append("another-stream", [new("dup", value=1)])
        with pytest.raises(IdempotencyConflict, match=r"'dup'.*type"):
            await store.append("s", [new("dup", type="test.other", value=1)])
        assert len(await store.read_all()) == 1

    async def test_a_batch_overlapping_stored_ids_is_refused_whole(self, store: EventStore) -> None:
        await store.append("s", [new("p1")])
        with pytest.raises(IdempotencyConflict, match="all-or-nothing"):
            await store.append("s", [new("p1"), new("p2")])
        assert [e.event_id for e in await store.read_all()] == ["p1"]

    async def test_duplicate_ids_within_one_batch_are_refused(self, store: EventStore) -> None:
        with pytest.raises(InvalidEvent, match="'x'"):
            await store.append("s", [new("x"), new("y"), new("x")])
        assert await store.read_all() == []

    # -- optimistic concurrency and atomicity ----------------------------------------------------

    async def test_a_wrong_expected_version_is_a_conflict_naming_stream_and_versions(self, store: EventStore) -> None:
        await store.append("search-7", [new("v1"), new("v2")])
        with pytest.raises(ConcurrencyError, match=r"'search-7' is at version 2, not the expected 1") as caught:
            await store.append("search-7", [new("v3")], expected_version=1)
        assert (caught.value.stream_id, caught.value.expected, caught.value.actual) == ("search-7", 1, 2)
        with pytest.raises(ConcurrencyError):
            await store.append("fresh", [new("f1")], expected_version=1)
        assert await store.stream_version("search-7") == 2

    async def test_a_batch_that_fails_midway_stores_nothing(self, store: EventStore) -> None:
        # Compact JSON under the limit, but jsonb's own text ("0, 0, ...") over it: the database refuses
        # the third row after inserting the first two, and the whole batch rolls back.
        zeros = [0] * (MAX_PAYLOAD_BYTES // 2 - 10)
        batch = [new("ok1"), new("ok2"), NewEvent(event_id="big", type="t", payload={"zeros": zeros})]
        with pytest.raises(PayloadTooLarge, match="'big'"):
            await store.append("s", batch)
        assert await store.read_all() == []
        assert await store.stream_version("s") == 0
        (after,) = await store.append("s", [new("next")])
        assert (after.position, after.stream_version) == (1, 1)  # no hole left by the rolled-back batch

    # -- size limit and bad input ------------------------------------------------------------------

    async def test_a_10_mb_payload_is_refused_with_the_fix(self, store: EventStore) -> None:
        huge = NewEvent(event_id="huge", type="candidate.compiled", payload={"log": "x" * 10_000_000})
        with pytest.raises(PayloadTooLarge, match=r"'huge'.*10000010 bytes.*content-addressed.*hash"):
            await store.append("s", [new("small"), huge])
        assert await store.read_all() == []

    async def test_a_payload_just_under_the_limit_is_stored(self, store: EventStore) -> None:
        text = "y" * (MAX_PAYLOAD_BYTES - 100)
        (stored,) = await store.append("s", [NewEvent(event_id="edge", type="t", payload={"log": text})])
        assert (await store.read_all())[0].payload["log"] == text == stored.payload["log"]

    async def test_values_json_cannot_hold_are_refused(self, store: EventStore) -> None:
        with pytest.raises(InvalidEvent, match="not JSON"):
            await store.append("s", [NewEvent(event_id="nan", type="t", payload={"x": float("nan")})])
        with pytest.raises(InvalidEvent, match="NUL"):
            await store.append("s", [NewEvent(event_id="nul", type="t", payload={"x": "a\x00b"})])
        with pytest.raises(InvalidEvent, match="non-empty"):
            await store.append("", [new("e")])
        assert await store.read_all() == []

    # -- typed events ------------------------------------------------------------------------------

    async def test_registered_types_decode_and_unknown_types_read_as_raw(self, store: EventStore) -> None:
        compiled = CandidateCompiled(candidate_id="c1", artifact="sha256:ab")
        await store.append("s", [to_new_event("typed", compiled, {"attempt": 1})])
        await store.append("s", [NewEvent(event_id="old", type="test.candidate_compiled", schema_version=1,
                                          payload={"candidate_id": "c0", "binary": "sha256:00"})])  # fmt: skip
        await store.append("s", [NewEvent(event_id="future", type="test.candidate_compiled", schema_version=9,
                                          payload={"whatever": 1})])  # fmt: skip
        await store.append("s", [NewEvent(event_id="bad", type="test.candidate_compiled", schema_version=2,
                                          payload={"candidate_id": 5})])  # fmt: skip
        await store.append("s", [new("unknown", type="from.a.newer.version", x=1)])

        typed, old, future, bad, unknown = [decode(e) for e in await store.read_stream("s")]
        assert typed == compiled
        assert old == CandidateCompiled(candidate_id="c0", artifact="sha256:00")
        assert isinstance(future, RawEvent) and "newer" in future.reason
        assert isinstance(bad, RawEvent) and "does not fit" in bad.reason
        assert unknown == RawEvent(
            type="from.a.newer.version",
            schema_version=1,
            payload={"x": 1},
            reason="unknown event type 'from.a.newer.version'",
        )

    # -- concurrency -------------------------------------------------------------------------------

    async def test_concurrent_writers_and_a_tailing_reader(self, store: EventStore) -> None:
        """8 writers (4 on their own streams, 4 racing on one shared stream with optimistic retries,
        all re-sending some appends as retries) while a reader tails the log by position."""
        writers_done = asyncio.Event()
        written: dict[str, list[str]] = defaultdict(list)  # stream -> event ids in the order written
        rng = random.Random(7)

        async def own_stream_writer(w: int) -> None:
            stream = f"own-{w}"
            for n in range(20):
                batch = [new(f"own-{w}-{n}-{k}", seq=n * 10 + k) for k in range(1 + n % 3)]
                stored = await store.append(stream, batch, expected_version=len(written[stream]))
                written[stream].extend(e.event_id for e in stored)
                if n % 4 == 0:  # the writer crashed after the commit and retries: no duplicate
                    assert await store.append(stream, batch) == stored
                await asyncio.sleep(rng.random() / 1000)

        async def shared_stream_writer(w: int) -> None:
            for n in range(12):
                event = new(f"shared-{w}-{n}", writer=w, n=n)
                while True:
                    version = await store.stream_version("shared")
                    try:
                        stored = await store.append("shared", [event], expected_version=version)
                        break
                    except ConcurrencyError:
                        await asyncio.sleep(rng.random() / 1000)
                written[f"shared-by-{w}"].append(stored[0].event_id)
                if n % 5 == 0:
                    assert await store.append("shared", [event], expected_version=0) == stored

        async def tail() -> list[RecordedEvent]:
            seen: list[RecordedEvent] = []
            cursor = 0
            while True:
                page = await store.read_all(after_position=cursor, limit=7)
                if page:
                    seen.extend(page)
                    cursor = page[-1].position
                elif writers_done.is_set() and cursor == await store.last_position():
                    return seen
                else:
                    await store.wait_for_events(cursor, timeout=0.2)

        async def write_all() -> None:
            await asyncio.gather(
                *(own_stream_writer(w) for w in range(4)), *(shared_stream_writer(w) for w in range(4, 8))
            )
            writers_done.set()

        tailed, _ = await asyncio.gather(tail(), write_all())

        everything = await store.read_all(limit=100_000)
        expected_ids = [i for ids in written.values() for i in ids]
        assert len(everything) == len(expected_ids) == 4 * sum(1 + n % 3 for n in range(20)) + 4 * 12
        assert sorted(e.event_id for e in everything) == sorted(expected_ids)  # none lost or duplicated
        assert [e.position for e in everything] == list(range(1, len(everything) + 1))
        assert tailed == everything  # the tail skipped nothing and saw it in the same order
        for stream in await store.streams():
            versions = [e.stream_version for e in await store.read_stream(stream)]
            assert versions == list(range(1, len(versions) + 1)), stream
        for w in range(4):  # each writer's own order is kept
            assert [e.event_id for e in await store.read_stream(f"own-{w}")] == written[f"own-{w}"]
        shared = [e.event_id for e in await store.read_stream("shared")]
        for w in range(4, 8):
            assert [i for i in shared if i.startswith(f"shared-{w}-")] == written[f"shared-by-{w}"]
        assert await store.verify() is None

    async def test_wait_for_events_wakes_on_append_and_times_out_on_silence(self, store: EventStore) -> None:
        assert await store.wait_for_events(0, timeout=0.05) is False
        waiter = asyncio.create_task(store.wait_for_events(0, timeout=30))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await store.append("s", [new("wake")])
        assert await waiter is True
        assert await store.wait_for_events(0, timeout=0) is True
        assert await store.wait_for_events(1, timeout=0.05) is False

    # -- projections -------------------------------------------------------------------------------

    async def test_a_projection_commits_its_view_with_its_checkpoint(self, store: EventStore) -> None:
        await store.append("s", [new(f"e{i}", value=i) for i in range(1, 6)])
        async with store.projection("totals") as tx:
            await tx.connection.execute("CREATE TABLE totals (event_id text PRIMARY KEY, value int)")
            assert tx.checkpoint == 0

        async def project(limit: int, fail: bool = False) -> None:
            async with store.projection("totals") as tx:
                for event in await tx.read(limit=limit):
                    await tx.connection.execute(
                        "INSERT INTO totals VALUES ($1, $2)", event.event_id, event.payload["value"]
                    )
                    tx.advance(event.position)
                if fail:
                    raise RuntimeError("projection crashed before commit")

        with pytest.raises(RuntimeError):
            await project(limit=3, fail=True)
        async with store.projection("totals") as tx:  # neither the rows nor the checkpoint moved
            assert tx.checkpoint == 0
            assert await tx.connection.fetchval("SELECT count(*) FROM totals") == 0

        # Concurrent copies of one projection take turns: each event lands in the view exactly once
        # (the primary key would refuse a second insert).
        await asyncio.gather(*(project(limit=1) for _ in range(5)))
        async with store.projection("totals") as tx:
            assert tx.checkpoint == 5
            assert await tx.connection.fetchval("SELECT sum(value) FROM totals") == 15
            with pytest.raises(ValueError, match="reset"):
                tx.advance(2)
            # Rebuild from position 0 gives the same view.
            await tx.connection.execute("DELETE FROM totals")
            tx.reset()
        await project(limit=100)
        async with store.projection("totals") as tx:
            assert tx.checkpoint == 5
            assert await tx.connection.fetchval("SELECT sum(value) FROM totals") == 15


class TestPostgresEventStore(EventStoreContract):
    """The asyncpg store: the contract, plus what the database itself enforces."""

    @pytest.mark.parametrize(
        "statement",
        [
            "UPDATE events SET payload = '{}'",
            "UPDATE events SET type = 'x' WHERE false",
            "DELETE FROM events",
            "TRUNCATE events",
        ],
    )
    async def test_update_delete_and_truncate_are_refused(self, store: EventStore, statement: str) -> None:
        await store.append("s", [new("keep")])
        async with store.pool.acquire() as connection:
            with pytest.raises(asyncpg.PostgresError, match="append-only"):
                await connection.execute(statement)
            # Replica mode silences ordinary triggers, not this one (ENABLE ALWAYS).
            await connection.execute("SET session_replication_role = replica")
            try:
                with pytest.raises(asyncpg.PostgresError, match="append-only"):
                    await connection.execute(statement)
            finally:
                await connection.execute("RESET session_replication_role")
        assert [e.event_id for e in await store.read_all()] == ["keep"]

    async def test_the_database_assigns_hashes_and_keeps_versions_contiguous(self, store: EventStore) -> None:
        async with store.pool.acquire() as connection:
            # A writer bypassing the store cannot choose position or hashes, nor skip a version.
            await connection.execute(
                "INSERT INTO events (position, event_id, stream_id, stream_version, type, payload, "
                "recorded_at, prev_hash, hash) VALUES (99, 'raw', 's', 1, 't', '{\"a\": 1}', now(), 'x', 'y')"
            )
            with pytest.raises(asyncpg.PostgresError, match="has no version 2"):
                await connection.execute(
                    "INSERT INTO events (event_id, stream_id, stream_version, type, payload) "
                    "VALUES ('skip', 's', 3, 't', '{}')"
                )
            with pytest.raises(asyncpg.PostgresError, match="over the limit"):
                await connection.execute(
                    "INSERT INTO events (event_id, stream_id, stream_version, type, payload) "
                    "VALUES ('big', 's', 2, 't', jsonb_build_object('x', repeat('z', 2000000)))"
                )
        (raw,) = await store.read_all()
        assert (raw.position, raw.prev_hash) == (1, GENESIS_HASH) and raw.hash != "y"
        assert await store.verify() is None

    async def test_verify_finds_a_row_a_superuser_changed(self, store: EventStore) -> None:
        await store.append("a", [new("a1"), new("a2", amount=2), new("a3")])
        await store.append("b", [new("b1")])
        async with store.pool.acquire() as connection:
            await _tamper(connection, "UPDATE events SET payload = '{\"amount\": 3}' WHERE event_id = 'a2'")
        broken = await store.verify()
        assert broken is not None
        assert (broken.event_id, broken.stream_version, broken.problem) == ("a2", 2, "hash_mismatch")
        assert "a2" in str(broken) and "hash mismatch" in str(broken)
        assert await store.verify("a") == broken
        assert await store.verify("b") is None

    async def test_verify_finds_a_rehashed_row_by_the_broken_chain(self, store: EventStore) -> None:
        await store.append("a", [new("a1"), new("a2", amount=2), new("a3")])
        async with store.pool.acquire() as connection:
            # A careful forger recomputes the changed row's hash; the next event's prev_hash still
            # points at the original.
            await _tamper(
                connection,
                "UPDATE events SET payload = '{\"amount\": 3}' WHERE event_id = 'a2';"
                "UPDATE events SET hash = kf_event_hash(position, event_id, stream_id, stream_version, type,"
                " schema_version, payload, metadata, recorded_at, prev_hash) WHERE event_id = 'a2'",
            )
        broken = await store.verify()
        assert broken is not None and (broken.event_id, broken.problem) == ("a3", "chain_broken")

    async def test_verify_finds_removed_events(self, store: EventStore) -> None:
        await store.append("a", [new("a1"), new("a2"), new("a3")])
        await store.append("b", [new("b1")])
        await store.append("a", [new("a4")])
        async with store.pool.acquire() as connection:
            await _tamper(connection, "DELETE FROM events WHERE event_id = 'b1'")
        # Stream b lost its only event: its own chain cannot tell, the log's positions can.
        assert await store.verify("b") is None
        broken = await store.verify()
        assert broken is not None and (broken.event_id, broken.problem) == ("a4", "position_gap")
        assert (broken.expected, broken.actual) == ("4", "5")
        async with store.pool.acquire() as connection:
            await _tamper(connection, "DELETE FROM events WHERE event_id = 'a2'")
        broken = await store.verify("a")
        assert broken is not None and (broken.event_id, broken.problem) == ("a3", "chain_broken")

    async def test_connecting_to_an_unmigrated_database_says_to_migrate(self, fresh_db_url: str) -> None:
        with pytest.raises(MigrationError, match="kf db migrate"):
            await EventStore.connect(fresh_db_url)


async def _tamper(connection: asyncpg.Connection, statement: str) -> None:
    """What a superuser can do: switch the append-only trigger off, change rows, switch it back on."""
    await connection.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
    try:
        await connection.execute(statement)
    finally:
        await connection.execute("ALTER TABLE events ENABLE ALWAYS TRIGGER events_append_only")
