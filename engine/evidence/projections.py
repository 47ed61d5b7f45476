"""Projection checkpoints: a projection commits its view and how far it has read in ONE transaction.

A projection (leaderboard, lessons) turns events into tables of its own. If it committed its view and
its checkpoint separately, a crash between the two would apply some events twice or never. Here both go
through the same connection and transaction::

    async with store.projection("lessons") as tx:
        for event in await tx.read(limit=500):       # events after tx.checkpoint
            await tx.connection.execute("INSERT INTO lessons ...", ...)
            tx.advance(event.position)
    # committed together; an exception inside the block rolls back view and checkpoint alike

Rebuilding: empty the view and call ``tx.reset()`` in the same block, then read from position 0 again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from engine.evidence.events import RECORDED_COLUMNS, RecordedEvent


class ProjectionTransaction:
    """One unit of a projection's work: its connection inside an open transaction, and its checkpoint."""

    def __init__(self, connection: asyncpg.Connection, name: str, checkpoint: int) -> None:
        self.connection = connection
        """The projection's connection; write the view through it so it commits with the checkpoint."""
        self.name = name
        """The projection's name, e.g. ``lessons``."""
        self._checkpoint = checkpoint
        self.started_at = checkpoint
        """The checkpoint stored when the transaction began."""

    @property
    def checkpoint(self) -> int:
        """Position of the last event included in the view (0 before the first)."""
        return self._checkpoint

    def advance(self, position: int) -> None:
        """Record that the view now includes every event up to ``position``."""
        if position < self._checkpoint:
            raise ValueError(
                f"projection {self.name!r} cannot move back from position {self._checkpoint} to {position}; "
                "call reset() to rebuild it from the start"
            )
        self._checkpoint = position

    def reset(self) -> None:
        """Start over from position 0 (the caller empties its view in the same transaction)."""
        self._checkpoint = 0

    async def read(self, limit: int = 1000) -> list[RecordedEvent]:
        """Up to ``limit`` events after the current checkpoint, in position order."""
        rows = await self.connection.fetch(
            f"SELECT {RECORDED_COLUMNS} FROM events WHERE position > $1 ORDER BY position LIMIT $2",
            self._checkpoint,
            limit,
        )
        return [RecordedEvent.from_row(row) for row in rows]


@asynccontextmanager
async def projection(pool: asyncpg.Pool, name: str) -> AsyncIterator[ProjectionTransaction]:
    """Open a transaction for projection ``name``; its checkpoint is saved when the block succeeds."""
    if not name:
        raise ValueError("a projection needs a non-empty name")
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(
            "INSERT INTO projection_checkpoints (name) VALUES ($1) ON CONFLICT (name) DO NOTHING", name
        )
        # FOR UPDATE: two copies of the same projection (two workers) take turns instead of both
        # applying the same events to the view.
        position: int = await connection.fetchval(
            "SELECT position FROM projection_checkpoints WHERE name = $1 FOR UPDATE", name
        )
        transaction = ProjectionTransaction(connection, name, position)
        yield transaction
        if transaction.checkpoint != position:
            await connection.execute(
                "UPDATE projection_checkpoints SET position = $2, updated_at = now() WHERE name = $1",
                name,
                transaction.checkpoint,
            )


async def checkpoint_of(pool: asyncpg.Pool, name: str) -> int:
    """The stored checkpoint of projection ``name`` (0 if it never ran)."""
    position: int | None = await pool.fetchval("SELECT position FROM projection_checkpoints WHERE name = $1", name)
    return position or 0
