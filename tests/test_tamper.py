"""Evidence that its own database's owner cannot quietly rewrite.

The application connects as ``kf_app``, which may only append and read: the database refuses it anything
else. The owner (``kf_owner``, who runs the migrations) can do anything inside the database, so these tests
tamper as the owner and check that the audit finds and names what changed: positions against the highest one
ever committed (`kf audit --all`), and a search's stream against the heads its Temporal history recorded
(`kf audit SEARCH_ID`), a witness outside the database.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from search_fixtures import COPY_PROBLEM, QUICK, running_worker, start
from temporalio.testing import WorkflowEnvironment

import cli
from activities.witness import witness_of
from engine.evidence.events import NewEvent, StreamHead
from engine.evidence.lessons_projection import catch_up_lessons
from engine.evidence.migrations import MIGRATIONS_DIR, migrate
from engine.evidence.roles import APP_ROLE, CREATE_ROLES_SQL, OWNER_ROLE, rewrite_privileges
from engine.evidence.store import EventStore
from engine.search.audit import audit_log, audit_search, format_audit, format_log_audit
from engine.search.history import stream_of
from engine.search.witness import Witness

_copies = itertools.count(1)


def as_role(url: str, role: str, database: str | None = None) -> str:
    """``url`` connecting as ``role`` (the test server trusts its Unix socket), to ``database`` if given."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    path = f"/{database}" if database else parts.path
    return urlunsplit((parts.scheme, f"{role}@{host}", path, parts.query, parts.fragment))


@dataclass
class Roles:
    """One database set up as the embedded server and docker-compose set theirs up."""

    owner_url: str
    """The owner: ran the migrations, owns the log."""
    app_url: str
    """The application's role."""


async def set_up_roles(superuser_url: str) -> Roles:
    connection = await asyncpg.connect(superuser_url)
    try:
        await connection.execute(CREATE_ROLES_SQL)
    finally:
        await connection.close()
    roles = Roles(owner_url=as_role(superuser_url, OWNER_ROLE), app_url=as_role(superuser_url, APP_ROLE))
    await migrate(roles.owner_url)
    return roles


@pytest.fixture
async def roles(fresh_db_url: str) -> Roles:
    return await set_up_roles(fresh_db_url)


@pytest.fixture
async def app_store(roles: Roles) -> AsyncIterator[EventStore]:
    """The event store as the application sees it."""
    store = await EventStore.connect(roles.app_url)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def owner(roles: Roles) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(roles.owner_url)
    try:
        yield connection
    finally:
        await connection.close()


def new(event_id: str, **payload: Any) -> NewEvent:
    return NewEvent(event_id=event_id, type="test.happened", payload=payload or {"id": event_id})


async def as_owner_with_the_trigger_off(owner: asyncpg.Connection, statement: str, *args: Any) -> None:
    """What the owner can do that the application cannot: switch the append-only trigger off and change rows."""
    await owner.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
    try:
        await owner.execute(statement, *args)
    finally:
        await owner.execute("ALTER TABLE events ENABLE ALWAYS TRIGGER events_append_only")


async def rewrite_and_rehash(owner: asyncpg.Connection, event_id: str, payload: dict[str, Any]) -> None:
    """The careful forger: change one event's payload and recompute its stream's chain from it to the end, so
    every hash and link verifies again."""
    row = await owner.fetchrow("SELECT stream_id, stream_version FROM events WHERE event_id = $1", event_id)
    await as_owner_with_the_trigger_off(
        owner, "UPDATE events SET payload = $2::jsonb WHERE event_id = $1", event_id, json.dumps(payload)
    )
    last = await owner.fetchval("SELECT max(stream_version) FROM events WHERE stream_id = $1", row["stream_id"])
    for version in range(row["stream_version"], last + 1):
        await as_owner_with_the_trigger_off(
            owner,
            """
            UPDATE events AS e SET
                prev_hash = coalesce((SELECT p.hash FROM events AS p
                                      WHERE p.stream_id = e.stream_id AND p.stream_version = e.stream_version - 1),
                                     repeat('0', 64))
            WHERE e.stream_id = $1 AND e.stream_version = $2;
            """,
            row["stream_id"],
            version,
        )
        await as_owner_with_the_trigger_off(
            owner,
            "UPDATE events SET hash = kf_event_hash(position, event_id, stream_id, stream_version, type, "
            "schema_version, payload, metadata, recorded_at, prev_hash) WHERE stream_id = $1 AND stream_version = $2",
            row["stream_id"],
            version,
        )


# -- the application's role ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET payload = '{}'",
        "DELETE FROM events",
        "TRUNCATE events",
        "ALTER TABLE events DISABLE TRIGGER events_append_only",
        "UPDATE event_log_head SET position = 0",
        "SELECT setval('events_position', 1)",
        "SELECT nextval('events_position')",
    ],
)
async def test_the_application_role_may_not_change_the_log(app_store: EventStore, statement: str) -> None:
    await app_store.append("s", [new("keep")])
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await app_store.pool.execute(statement)
    assert [e.event_id for e in await app_store.read_all()] == ["keep"]
    assert await app_store.verify() is None and (await app_store.positions()).intact


async def test_the_application_role_appends_reads_and_projects(
    app_store: EventStore, owner: asyncpg.Connection
) -> None:
    assert await rewrite_privileges(app_store.pool) == []
    assert "owner of the events table" in await rewrite_privileges(owner)
    await app_store.append("a", [new("a1"), new("a2")])
    (b1,) = await app_store.append("b", [new("b1")])
    assert b1.position == 3
    # A projection keeps its own tables and checkpoint, and may empty them to rebuild.
    assert await catch_up_lessons(app_store) == 3
    await app_store.pool.execute("TRUNCATE lesson_stats")
    # The insert trigger runs as the owner with its own search_path: a temporary table of the caller's named
    # like the log cannot supply the previous hash.
    async with app_store.pool.acquire() as connection:
        await connection.execute("CREATE TEMPORARY TABLE events (stream_id text, stream_version int, hash text)")
        await connection.execute("INSERT INTO events VALUES ('a', 2, 'forged')")
        await connection.execute(
            "INSERT INTO public.events (event_id, stream_id, stream_version, type, payload) "
            "VALUES ('a3', 'a', 3, 't', '{}')"
        )
        await connection.execute("DROP TABLE pg_temp.events")
    assert (await app_store.read_stream("a"))[-1].prev_hash == (await app_store.read_stream("a"))[1].hash
    assert await app_store.verify() is None


async def test_a_rolled_back_append_leaves_no_gap(app_store: EventStore) -> None:
    await app_store.append("s", [new("s1")])
    async with app_store.pool.acquire() as connection:
        with pytest.raises(RuntimeError, match="changed my mind"):
            async with connection.transaction():
                await connection.execute(
                    "INSERT INTO events (event_id, stream_id, stream_version, type, payload) "
                    "VALUES ('s2', 's', 2, 't', '{}'), ('s3', 's', 3, 't', '{}')"
                )
                raise RuntimeError("changed my mind")
    # Positions 2 and 3 were issued and never committed: not a gap, and not a missing tail.
    positions = await app_store.positions()
    assert (positions.committed, positions.issued, positions.intact) == (1, 3, True)
    (s2,) = await app_store.append("s", [new("s2")])
    assert s2.position == 2
    positions = await app_store.positions()
    assert (positions.committed, positions.issued, positions.gaps, positions.intact) == (2, 2, [], True)


async def test_a_log_an_older_kf_migrated_as_the_superuser_passes_to_the_owner(
    fresh_db_url: str, tmp_path: Path
) -> None:
    # Before the two roles, `kf up` migrated (and everything connected) as the embedded server's superuser.
    before = tmp_path / "migrations"
    before.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql"))[:4]:
        shutil.copy(path, before)
    await migrate(fresh_db_url, before)
    connection = await asyncpg.connect(fresh_db_url)
    try:
        await connection.execute(
            "INSERT INTO events (event_id, stream_id, stream_version, type, payload) VALUES ('old', 's', 1, 't', '{}')"
        )
    finally:
        await connection.close()
    roles = await set_up_roles(fresh_db_url)  # what `kf up` now does: create the roles, migrate as the owner
    async with await EventStore.connect(roles.app_url) as store:
        (new_event,) = await store.append("s", [new("new")])
        assert (new_event.position, new_event.stream_version) == (2, 2)
        assert await store.verify() is None and (await store.positions()).intact
        assert await rewrite_privileges(store.pool) == []


# -- the owner, caught by positions ------------------------------------------------------------------------


async def test_removing_the_logs_last_event_is_found_before_and_after_the_next_append(
    app_store: EventStore, owner: asyncpg.Connection, roles: Roles
) -> None:
    await app_store.append("a", [new("a1"), new("a2")])
    await app_store.append("b", [new("b1")])
    await as_owner_with_the_trigger_off(owner, "DELETE FROM events WHERE event_id = 'b1'")
    # Stream b is gone entirely and stream a is whole: no chain can tell. The committed head can.
    assert await app_store.verify() is None
    positions = await app_store.positions()
    (tail,) = positions.gaps
    assert (tail.first, tail.last, tail.after) == (3, 3, None)
    assert tail.before is not None and (tail.before.event_id, tail.before.stream_id) == ("a2", "a")
    assert "position 3 missing, after event 'a2' (stream 'a' v2, position 2), at the tail" in str(tail)

    # The next append does not take the removed event's position (max(position) + 1 would): the hole stays.
    (c1,) = await app_store.append("c", [new("c1")])
    assert c1.position == 4
    report = await audit_log(roles.app_url)
    assert not report["intact"] and report["chain"]["intact"]
    (gap,) = report["positions"]["gaps"]
    assert (gap["first"], gap["last"], gap["before"]["event_id"], gap["after"]["event_id"]) == (3, 3, "a2", "c1")
    text = format_log_audit(report)
    assert "1 GAP(S)" in text
    assert "position 3 missing, after event 'a2' (stream 'a' v2, position 2), before event 'c1' (stream 'c' v1" in text


async def test_a_sequence_set_back_by_hand_never_reissues_a_committed_position(
    app_store: EventStore, owner: asyncpg.Connection
) -> None:
    await app_store.append("a", [new("a1"), new("a2"), new("a3")])
    await as_owner_with_the_trigger_off(owner, "DELETE FROM events WHERE event_id = 'a3'")
    await owner.execute("SELECT setval('events_position', 2)")
    assert (await app_store.positions()).sequence_set_back
    (b1,) = await app_store.append("b", [new("b1")])
    assert b1.position == 4  # not 3: the head remembers 3 was committed
    assert [(g.first, g.last) for g in (await app_store.positions()).gaps] == [(3, 3)]


# -- the owner, caught by the witness in Temporal's history ------------------------------------------------


@dataclass
class RecordedSearch:
    """A finished search, its database kept as a template that each test copies and tampers with."""

    search_id: str
    template: str
    superuser_url: str
    head: StreamHead | None


@pytest.fixture(scope="module")
async def recorded_search(pg_url: str, temporal_env: WorkflowEnvironment) -> RecordedSearch:
    template = f"kf_tamper_template_{uuid.uuid4().hex[:8]}"
    connection = await asyncpg.connect(pg_url)
    try:
        await connection.execute(f'CREATE DATABASE "{template}"')
    finally:
        await connection.close()
    superuser_url = as_role(pg_url, "postgres", template)
    roles = await set_up_roles(superuser_url)
    prefix = f"tamper-{uuid.uuid4().hex[:6]}"
    store = await EventStore.connect(roles.app_url)
    try:
        async with running_worker(temporal_env.client, store, prefix):
            handle = await start(
                temporal_env.client,
                prefix,
                {"problem": "softmax", "generations": 1, "candidates_per_generation": 1, **QUICK},
            )
            result = await handle.result()
    finally:
        await store.close()
    return RecordedSearch(search_id=handle.id, template=template, superuser_url=pg_url, head=result.head)


@dataclass
class SearchCopy:
    search_id: str
    app_url: str
    store: EventStore
    owner: asyncpg.Connection
    witness: Witness


@pytest.fixture
async def search_copy(recorded_search: RecordedSearch, temporal_env: WorkflowEnvironment) -> AsyncIterator[SearchCopy]:
    name = f"kf_tamper_{next(_copies)}"
    connection = await asyncpg.connect(recorded_search.superuser_url)
    try:
        await connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{recorded_search.template}"')
    finally:
        await connection.close()
    app_url = as_role(recorded_search.superuser_url, APP_ROLE, name)
    store = await EventStore.connect(app_url)
    owner = await asyncpg.connect(as_role(recorded_search.superuser_url, OWNER_ROLE, name))
    witness = await witness_of(temporal_env.client, recorded_search.search_id)
    try:
        yield SearchCopy(recorded_search.search_id, app_url, store, owner, witness)
    finally:
        await owner.close()
        await store.close()


async def test_a_finished_search_records_its_head_and_audits_intact_with_its_witness(
    search_copy: SearchCopy, recorded_search: RecordedSearch
) -> None:
    events = await search_copy.store.read_stream(stream_of(search_copy.search_id))
    assert events[-1].type == "search.finished"
    assert recorded_search.head == StreamHead.of(events[-1])
    witness = search_copy.witness
    assert witness.usable and witness.final is not None and witness.final.head == recorded_search.head
    # Every step recorded a head: the audit can locate a change to within one step's events.
    witnessed = {w.head.version for w in witness.heads}
    for event in events:
        if event.type in ("candidate.compiled", "candidate.validated", "candidate.benchmarked", "search.finished"):
            assert event.stream_version in witnessed, event.event_id
    report = await audit_search(search_copy.app_url, search_copy.search_id, witness)
    assert report["intact"] and report["witness"]["status"] == "intact"
    assert "witness: intact" in format_audit(report)


async def test_a_rewritten_and_rehashed_event_is_found_and_named(search_copy: SearchCopy) -> None:
    stream = stream_of(search_copy.search_id)
    events = await search_copy.store.read_stream(stream)
    target = next(e for e in events if e.type == "candidate.benchmarked")
    forged = {**target.payload, "output": {**target.payload["output"], "speedup": 99.0}}
    await rewrite_and_rehash(search_copy.owner, target.event_id, forged)
    # The chain and the positions verify: inside the database, the forgery is perfect.
    assert await search_copy.store.verify(stream) is None
    assert await search_copy.store.verify() is None and (await search_copy.store.positions()).intact

    report = await audit_search(search_copy.app_url, search_copy.search_id, search_copy.witness)
    assert not report["intact"] and report["chain"]["intact"]
    (finding,) = report["witness"]["findings"]
    assert finding["problem"] == "rewritten"
    assert finding["event_ids"] == [target.event_id]
    assert (finding["first_version"], finding["last_version"]) == (target.stream_version, target.stream_version)
    assert f"event {target.event_id!r} (v{target.stream_version}) was changed" in format_audit(report)


async def test_a_truncated_stream_is_found_and_the_removed_events_named(search_copy: SearchCopy) -> None:
    stream = stream_of(search_copy.search_id)
    events = await search_copy.store.read_stream(stream)
    # Another stream appends after the search, so the cut is not the log's tail.
    await search_copy.store.append("other", [new("later")])
    removed = events[-3:]
    await as_owner_with_the_trigger_off(
        search_copy.owner, "DELETE FROM events WHERE event_id = ANY($1)", [e.event_id for e in removed]
    )
    assert await search_copy.store.verify(stream) is None  # what is left of the stream is a valid chain

    report = await audit_search(search_copy.app_url, search_copy.search_id, search_copy.witness)
    assert not report["intact"]
    (finding,) = report["witness"]["findings"]
    assert finding["problem"] == "missing"
    assert (finding["first_version"], finding["last_version"]) == (removed[0].stream_version, events[-1].stream_version)
    assert removed[-1].event_id in finding["event_ids"]  # the search's finished record, named from the witness
    assert f"the stream ends at v{removed[0].stream_version - 1}" in format_audit(report)
    # And the log's positions show the hole, with the events around it.
    (gap,) = (await search_copy.store.positions()).gaps
    assert (gap.first, gap.last) == (removed[0].position, removed[-1].position)
    assert gap.before is not None and gap.before.event_id == events[-4].event_id
    assert gap.after is not None and gap.after.event_id == "later"


async def test_kf_audit_names_the_change_and_exits_1(
    search_copy: SearchCopy, temporal_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    events = await search_copy.store.read_stream(stream_of(search_copy.search_id))
    target = next(e for e in events if e.type == "candidate.validated")
    await rewrite_and_rehash(search_copy.owner, target.event_id, {**target.payload, "output": {"verdict": "ok"}})
    monkeypatch.setenv("KF_DATABASE_URL", search_copy.app_url)
    monkeypatch.setenv("KF_TEMPORAL_ADDRESS", temporal_env.client.service_client.config.target_host)
    assert await asyncio.to_thread(cli.main, ["audit", search_copy.search_id]) == 1
    printed = capsys.readouterr().out
    assert "hash chain: intact" in printed and "witness: MISMATCH" in printed
    assert f"event {target.event_id!r} (v{target.stream_version}) was changed" in printed
    assert await asyncio.to_thread(cli.main, ["audit", "--all"]) == 0  # positions and chains: nothing to see


async def test_without_a_witness_the_audit_says_so_instead_of_intact(app_store: EventStore, roles: Roles) -> None:
    # A stream whose search Temporal does not know (deleted after retention, another cluster).
    await app_store.append(stream_of("search-gone"), [new("search-gone/started")])
    unknown = Witness(search_id="search-gone", available=False, reason="Temporal has no history of search-gone")
    report = await audit_search(roles.app_url, "search-gone", unknown)
    assert report["chain"]["intact"] and report["witness"]["status"] == "unavailable"
    assert "witness: UNAVAILABLE — Temporal has no history of search-gone" in format_audit(report)


async def test_a_search_temporal_does_not_know_has_an_unavailable_witness(temporal_env: WorkflowEnvironment) -> None:
    witness = await witness_of(temporal_env.client, f"search-never-{uuid.uuid4().hex[:8]}")
    assert not witness.available and not witness.usable
    assert "Temporal has no history of search-never-" in witness.reason


async def test_the_witness_spans_every_run_of_a_search_that_continued_as_new(
    roles: Roles, temporal_env: WorkflowEnvironment
) -> None:
    prefix = f"tamper-can-{uuid.uuid4().hex[:6]}"
    async with await EventStore.connect(roles.app_url) as store:
        async with running_worker(temporal_env.client, store, prefix):
            handle = await start(
                temporal_env.client,
                prefix,
                {"problem": COPY_PROBLEM, "generations": 2, "candidates_per_generation": 1, "continue_as_new_every": 1}
                | QUICK,
            )
            result = await handle.result()
        events = await store.read_stream(stream_of(handle.id))
    witness = await witness_of(temporal_env.client, handle.id)
    assert witness.available and "3 run(s)" in witness.source and not witness.reason
    assert witness.final is not None and witness.final.head == result.head == StreamHead.of(events[-1])
    witnessed = {w.head.version for w in witness.heads}
    compiled = [e.stream_version for e in events if e.type == "candidate.compiled"]
    assert len(compiled) == 3 and set(compiled) <= witnessed  # one per generation, each in its own run
    assert any("continue-as-new" in w.source for w in witness.heads)
    report = await audit_search(roles.app_url, handle.id, witness)
    assert report["intact"] and report["witness"]["status"] == "intact"
