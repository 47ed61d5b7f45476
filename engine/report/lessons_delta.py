"""The lessons a search started with, and what it added to them.

The lessons projection (engine/evidence/lessons_projection.py) only knows the log as it is now, later
searches included. To see it as it stood when a search started, the same fold runs again into scratch
copies of its tables: first over every event before the search's ``search.started``, then over the search's
own events alone (what other searches recorded meanwhile is theirs, not this search's contribution).
:func:`~engine.evidence.lessons.lessons_for` then reads each state, so the report's lessons are exactly
those the projection would have served, computed by the same code.

The scratch copies are temporary tables of one private connection: Postgres looks up an unqualified table
name in the session's temporary schema first, so the fold and ``lessons_for`` read and write the copies
without knowing it, and the copies vanish with the connection. The real view is never written (checked
before the first write), and the application role needs no privilege beyond Postgres's default TEMPORARY.
"""

from __future__ import annotations

import asyncpg

from engine.evidence.events import RecordedEvent
from engine.evidence.lessons import Lessons, lessons_for
from engine.evidence.lessons_projection import PAGE_SIZE, PROJECTION, apply_events
from engine.evidence.store import EventStore
from engine.report.model import ChangeDelta, LessonsReport

# Every table the lessons fold reads or writes, its checkpoint's included (migrations 0002-0004).
SCRATCH_TABLES = (
    "projection_checkpoints",
    "lesson_searches",
    "lesson_candidates",
    "lesson_stats",
    "lesson_failures",
    "candidate_evidence",
    "lesson_settings",
)


class _NotShadowed(Exception):
    """A table of the view still resolves to the real one after its temporary copy was made."""


async def lessons_report(
    database_url: str, problem: str, target: str, started_position: int, own_events: list[RecordedEvent]
) -> LessonsReport:
    """The lessons for ``problem`` on ``target`` before the search whose ``search.started`` is at
    ``started_position``, and after its ``own_events``; unavailable (with the reason) when the database
    refuses the scratch tables."""
    scratch = await EventStore.connect(database_url, min_size=1, max_size=1)
    try:
        try:
            await _shadow_view(scratch)
        except (asyncpg.PostgresError, _NotShadowed) as error:
            return LessonsReport(
                available=False,
                reason=f"the lessons could not be recomputed in scratch tables ({error}); the application's role "
                "needs Postgres's TEMPORARY privilege on the database",
            )
        await _fold_log_before(scratch, started_position)
        before = await lessons_for(scratch, problem, target, catch_up=False)
        await _fold(scratch, [e for e in own_events if e.position >= started_position])
        after = await lessons_for(scratch, problem, target, catch_up=False)
    finally:
        await scratch.close()  # the temporary tables go with the session
    return LessonsReport(
        available=True,
        reason=f"projected from the {before.through_position} event positions before the search, then its own "
        f"{len(own_events)} events",
        before=before.summary,
        after=after.summary,
        changes=_change_deltas(before, after),
        new_failures=_new_failures(before, after),
        new_dead_ends=sorted(set(after.dead_ends) - set(before.dead_ends)),
    )


async def _shadow_view(scratch: EventStore) -> None:
    """Create an empty temporary copy of each table of the view on the scratch store's only connection, and
    make sure every unqualified name now resolves to the copy."""
    async with scratch.pool.acquire() as connection:
        for table in SCRATCH_TABLES:
            # LIKE … INCLUDING ALL keeps the keys the fold's ON CONFLICT clauses rely on.
            await connection.execute(f"CREATE TEMPORARY TABLE {table} (LIKE public.{table} INCLUDING ALL)")
        shadowed = await connection.fetchval(
            "SELECT count(*) FROM unnest($1::text[]) AS t(name) "
            "JOIN pg_class ON pg_class.oid = to_regclass(t.name) WHERE relnamespace = pg_my_temp_schema()",
            list(SCRATCH_TABLES),
        )
    if shadowed != len(SCRATCH_TABLES):
        # Never fold into the real view: its checkpoint would claim events it folded differently.
        raise _NotShadowed(
            f"only {shadowed} of {len(SCRATCH_TABLES)} lesson tables resolve to the session's temporary copies "
            "(is pg_temp placed after public in search_path?)"
        )


async def _fold_log_before(scratch: EventStore, position: int) -> None:
    """Fold every event of the log before ``position`` into the scratch view, a page at a time."""
    while True:
        async with scratch.projection(PROJECTION) as tx:
            events = await tx.read(limit=PAGE_SIZE)
            wanted = [e for e in events if e.position < position]
            if wanted:
                await apply_events(tx, wanted)
        if len(wanted) < PAGE_SIZE:
            return


async def _fold(scratch: EventStore, events: list[RecordedEvent]) -> None:
    """Fold ``events`` (in position order, after everything folded so far) into the scratch view."""
    for start in range(0, len(events), PAGE_SIZE):
        async with scratch.projection(PROJECTION) as tx:
            await apply_events(tx, events[start : start + PAGE_SIZE])


def _change_deltas(before: Lessons, after: Lessons) -> list[ChangeDelta]:
    """The changes whose own-problem evidence the search added to, most attempts first."""
    earlier = {c.change: c for c in before.changes if c.scope == "problem"}
    deltas = []
    for change in after.changes:
        if change.scope != "problem":
            continue
        old = earlier.get(change.change)
        counts_then = (old.attempts, old.validated, old.versus_parent) if old else (0, 0, 0)
        if (change.attempts, change.validated, change.versus_parent) == counts_then:
            continue  # the search added nothing about it
        deltas.append(
            ChangeDelta(
                change=change.change,
                attempts_before=old.attempts if old else 0,
                attempts_after=change.attempts,
                correct_before=old.correct if old else 0,
                correct_after=change.correct,
                speedup_over_parent_before=old.speedup_over_parent if old else None,
                speedup_over_parent_after=change.speedup_over_parent,
                dead_end_after=change.dead_end,
            )
        )
    return sorted(deltas, key=lambda d: (-(d.attempts_after - d.attempts_before), d.change))


def _new_failures(before: Lessons, after: Lessons) -> list[str]:
    """One line per failure pattern of the problem the search added occurrences to."""
    earlier = {(f.kind, f.pattern): f.count for f in before.failures if f.scope == "problem"}
    lines = []
    for failure in after.failures:
        if failure.scope != "problem" or failure.count <= earlier.get((failure.kind, failure.pattern), 0):
            continue
        added = failure.count - earlier.get((failure.kind, failure.pattern), 0)
        lines.append(
            f"{failure.kind} failure {failure.pattern!r}: {added} more ({failure.count} in all); {failure.example}"
        )
    return lines
