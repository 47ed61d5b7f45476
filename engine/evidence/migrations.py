"""Schema migrations: numbered SQL files in ``migrations/``, applied in order, each in its own transaction,
recorded with a sha-256 checksum in ``schema_migrations``.

Rules the runner enforces, so every database that says it is at migration N has the same schema:

- a file is named ``NNNN_what_it_does.sql`` (four digits, lowercase words);
- an applied migration is never edited (its checksum is compared on every run) and never deleted;
- a new migration is numbered after every applied one;
- two ``migrate`` calls at once (two workers starting) take turns on an advisory lock: the second finds
  the work done.

A migration runs inside a transaction, so statements that refuse one (CREATE INDEX CONCURRENTLY,
ALTER TYPE ... ADD VALUE before PG 12) cannot be used.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import asyncpg
from pydantic import BaseModel, ConfigDict

from engine.database_url import check_database_url, connect
from engine.errors import MigrationError

MIGRATIONS_DIR: Path = Path(str(importlib.resources.files("migrations")))
"""The migrations shipped with Kernel Factory: the ``migrations`` package's data (pyproject.toml), so an installed
wheel finds them as a checkout does (where they are the repository's ``migrations/``)."""

MIGRATIONS_LOCK_KEY = 7171002
"""Session-level advisory lock held while migrating (the event store's append lock is 7171001)."""

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name        text        PRIMARY KEY,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    name: str
    """File name, e.g. ``0001_event_store.sql``; also its key in schema_migrations."""
    path: Path
    """Where the file is."""
    sql: str
    """Its SQL text."""
    checksum: str
    """sha-256 (hex) of the file's bytes."""


class MigrationState(BaseModel):
    """Where one migration stands in one database."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    name: str
    """File name, e.g. ``0001_event_store.sql``."""
    state: Literal["applied", "pending", "edited", "missing"]
    """applied: in the database with the file's checksum; pending: not applied yet; edited: applied, but
    the file changed since; missing: applied, but the file is gone."""
    checksum: str | None
    """sha-256 of the file as it is now (None when the file is missing)."""
    applied_checksum: str | None
    """sha-256 recorded when it was applied (None when pending)."""
    applied_at: datetime | None
    """When it was applied (None when pending)."""


def load_migrations(migrations_dir: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files of ``migrations_dir`` in order; MigrationError for a misnamed or duplicate one."""
    if not migrations_dir.is_dir():
        raise MigrationError(
            f"migrations folder {migrations_dir} does not exist: leave out --migrations-dir for the installed ones"
        )
    migrations: list[Migration] = []
    numbers: dict[str, str] = {}
    for path in sorted(migrations_dir.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(
                f"migration file {path} is misnamed: name it NNNN_what_it_does.sql "
                "(four digits, then lowercase letters, digits and underscores)"
            )
        number = match.group(1)
        if number in numbers:
            raise MigrationError(
                f"migrations {numbers[number]} and {path.name} share the number {number}: renumber the "
                "one that is not applied anywhere yet"
            )
        numbers[number] = path.name
        data = path.read_bytes()
        migrations.append(
            Migration(
                name=path.name,
                path=path,
                sql=data.decode("utf-8"),
                checksum=hashlib.sha256(data).hexdigest(),
            )
        )
    return migrations


async def migrate(database_url: str, migrations_dir: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the pending migrations of ``migrations_dir`` in order; return the names newly applied.

    ``database_url`` connects as the owner role (``kf db migrate`` uses KF_DATABASE_OWNER_URL): the objects
    it creates belong to it, and the application's role gets only the privileges the migrations grant."""
    check_database_url(database_url)
    migrations = load_migrations(migrations_dir)
    connection = await connect(database_url)
    try:
        # Session-level, not transaction-level: each migration commits on its own, and the lock must
        # cover the whole run (history check included) so a concurrent run waits and then finds nothing
        # left to do, instead of applying the same file twice.
        await connection.execute("SELECT pg_advisory_lock($1)", MIGRATIONS_LOCK_KEY)
        try:
            # Only when missing: CREATE ... IF NOT EXISTS still needs CREATE on the schema, which the
            # application's role lacks, and an up-to-date database must not fail `kf up` run as that role.
            if await connection.fetchval("SELECT to_regclass('schema_migrations') IS NULL"):
                await connection.execute(_CREATE_TABLE)
            applied = await _applied(connection)
            pending = _pending(migrations, applied, migrations_dir)
            newly_applied: list[str] = []
            for migration in pending:
                await _apply(connection, migration)
                newly_applied.append(migration.name)
            return newly_applied
        finally:
            await connection.execute("SELECT pg_advisory_unlock($1)", MIGRATIONS_LOCK_KEY)
    finally:
        await connection.close()


async def migration_status(database_url: str, migrations_dir: Path = MIGRATIONS_DIR) -> list[MigrationState]:
    """Every migration known to the folder or to the database, with its state, in name order.
    Reports edited and missing migrations instead of raising."""
    check_database_url(database_url)
    migrations = {m.name: m for m in load_migrations(migrations_dir)}
    connection = await connect(database_url)
    try:
        exists = await connection.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        applied = await _applied(connection) if exists else {}
    finally:
        await connection.close()
    states: list[MigrationState] = []
    for name in sorted(set(migrations) | set(applied)):
        file = migrations.get(name)
        record = applied.get(name)
        if record is None:
            state: Literal["applied", "pending", "edited", "missing"] = "pending"
        elif file is None:
            state = "missing"
        elif file.checksum != record[0]:
            state = "edited"
        else:
            state = "applied"
        states.append(
            MigrationState(
                name=name,
                state=state,
                checksum=file.checksum if file else None,
                applied_checksum=record[0] if record else None,
                applied_at=record[1] if record else None,
            )
        )
    return states


async def _applied(connection: asyncpg.Connection) -> dict[str, tuple[str, datetime]]:
    rows = await connection.fetch("SELECT name, checksum, applied_at FROM schema_migrations ORDER BY name")
    return {row["name"]: (row["checksum"], row["applied_at"]) for row in rows}


def _pending(
    migrations: list[Migration], applied: dict[str, tuple[str, datetime]], migrations_dir: Path
) -> list[Migration]:
    """The migrations still to apply, after checking that the applied history matches the files."""
    files = {m.name: m for m in migrations}
    for name, (checksum, applied_at) in applied.items():
        file = files.get(name)
        if file is None:
            raise MigrationError(
                f"migration {name} was applied to this database on {applied_at:%Y-%m-%d %H:%M} but "
                f"{migrations_dir / name} is missing: restore it (from version control); an applied "
                "migration must never be deleted"
            )
        if file.checksum != checksum:
            raise MigrationError(
                f"migration {file.path} was edited after it was applied: its checksum is now {file.checksum}, "
                f"but {checksum} was applied on {applied_at:%Y-%m-%d %H:%M}. Restore the applied text and "
                "put the change in a new migration"
            )
    pending = [m for m in migrations if m.name not in applied]
    if pending and applied:
        last = max(applied)
        early = [m.name for m in pending if m.name < last]
        if early:
            raise MigrationError(
                f"migrations {early} are numbered before {last}, which is already applied: renumber them "
                "after it, so every database applies migrations in the same order"
            )
    return pending


async def _apply(connection: asyncpg.Connection, migration: Migration) -> None:
    try:
        async with connection.transaction():
            await connection.execute(migration.sql)
            await connection.execute(
                "INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)",
                migration.name,
                migration.checksum,
            )
    except asyncpg.PostgresError as error:
        where = ""
        position = getattr(error, "position", None)
        if position:
            line = migration.sql[: int(position) - 1].count("\n") + 1
            where = f" at line {line}"
        raise MigrationError(
            f"migration {migration.path} failed{where}: {error}. Nothing of it was applied (it runs in one "
            "transaction); fix it and run `kf db migrate` again"
        ) from error
