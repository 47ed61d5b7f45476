"""The migration runner and `kf db` against a real Postgres: order, checksums, concurrency, bad input."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

import asyncpg
import pytest

import cli
from cli import main
from engine.database_url import check_database_url, mask_password
from engine.errors import ConfigurationError, MigrationError
from engine.evidence.migrations import MIGRATIONS_DIR, load_migrations, migrate, migration_status

ALL = [path.name for path in sorted(MIGRATIONS_DIR.glob("*.sql"))]


@pytest.fixture
def migrations_dir(tmp_path: Path) -> Path:
    """A copy of the repository's migrations that a test may edit."""
    folder = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, folder)
    return folder


async def test_migrate_applies_every_file_once_in_order(fresh_db_url: str) -> None:
    assert [s.state for s in await migration_status(fresh_db_url)] == ["pending"] * len(ALL)
    assert await migrate(fresh_db_url) == ALL
    assert await migrate(fresh_db_url) == []
    states = await migration_status(fresh_db_url)
    assert [(s.name, s.state) for s in states] == [(name, "applied") for name in ALL]
    assert all(s.checksum == s.applied_checksum and s.applied_at is not None for s in states)
    connection = await asyncpg.connect(fresh_db_url)
    try:
        assert await connection.fetchval("SELECT to_regclass('events') IS NOT NULL")
        assert await connection.fetchval("SELECT to_regclass('projection_checkpoints') IS NOT NULL")
    finally:
        await connection.close()


async def test_concurrent_migrate_calls_apply_each_migration_once(fresh_db_url: str) -> None:
    results = await asyncio.gather(*(migrate(fresh_db_url) for _ in range(4)))
    assert sorted(name for applied in results for name in applied) == ALL


async def test_an_edited_applied_migration_is_refused(fresh_db_url: str, migrations_dir: Path) -> None:
    await migrate(fresh_db_url, migrations_dir)
    edited = migrations_dir / ALL[-1]
    before = hashlib.sha256(edited.read_bytes()).hexdigest()
    edited.write_text(edited.read_text() + "\n-- a harmless-looking edit\n")
    after = hashlib.sha256(edited.read_bytes()).hexdigest()
    with pytest.raises(MigrationError, match=rf"{ALL[-1]} was edited.*{after}.*{before}.*new migration"):
        await migrate(fresh_db_url, migrations_dir)
    assert [s.state for s in await migration_status(fresh_db_url, migrations_dir)][-1] == "edited"


async def test_a_missing_applied_migration_is_refused(fresh_db_url: str, migrations_dir: Path) -> None:
    await migrate(fresh_db_url, migrations_dir)
    (migrations_dir / ALL[0]).unlink()
    with pytest.raises(MigrationError, match=rf"{ALL[0]} was applied.*is missing: restore it"):
        await migrate(fresh_db_url, migrations_dir)
    states = await migration_status(fresh_db_url, migrations_dir)
    assert (states[0].name, states[0].state, states[0].checksum) == (ALL[0], "missing", None)


async def test_a_failing_migration_is_rolled_back_and_named(fresh_db_url: str, migrations_dir: Path) -> None:
    (migrations_dir / "0900_broken.sql").write_text(
        "CREATE TABLE half_done (id int);\n\nSELECT no_such_column FROM half_done;\n"
    )
    with pytest.raises(MigrationError, match=r"0900_broken.sql failed at line 3: .*no_such_column"):
        await migrate(fresh_db_url, migrations_dir)
    connection = await asyncpg.connect(fresh_db_url)
    try:
        assert await connection.fetchval("SELECT to_regclass('half_done')") is None
        applied = await connection.fetch("SELECT name FROM schema_migrations ORDER BY name")
    finally:
        await connection.close()
    assert [row["name"] for row in applied] == ALL  # the good ones before it stay applied


async def test_a_migration_numbered_before_an_applied_one_is_refused(fresh_db_url: str, migrations_dir: Path) -> None:
    (migrations_dir / "0900_later.sql").write_text("SELECT 1;\n")
    await migrate(fresh_db_url, migrations_dir)
    (migrations_dir / "0500_merged_late.sql").write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match=r"0500_merged_late.sql.*numbered before 0900_later.sql"):
        await migrate(fresh_db_url, migrations_dir)


@pytest.mark.parametrize(
    ("file_name", "complaint"),
    [("1_short.sql", "misnamed"), ("0001_Upper.sql", "misnamed"), ("0001_again.sql", "share the number 0001")],
)
def test_misnamed_or_duplicate_files_are_refused(migrations_dir: Path, file_name: str, complaint: str) -> None:
    (migrations_dir / file_name).write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match=complaint):
        load_migrations(migrations_dir)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "localhost:5432/kf",
        "http://kf:secret@localhost/kf",
        "postgresql://kf:secret@localhost:notaport/kf",
        "postgresql://kf:secret@localhost:99999/kf",
        "postgresql:///kf",
        "postgresql://kf:secret@localhost/kf/extra",
    ],
)
async def test_a_malformed_database_url_is_refused_with_the_expected_form(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"malformed database URL.*expected postgresql://USER") as caught:
        await migrate(url)
    assert "secret" not in str(caught.value)


async def test_an_unreachable_database_is_a_configuration_error(tmp_path: Path, pg_url: str) -> None:
    nowhere = f"postgresql://kf:secret@/kf?host={tmp_path / 'no-socket-here'}"
    with pytest.raises(ConfigurationError, match=r"cannot connect to Postgres at .*kf:\*\*\*@.*kf up") as caught:
        await migrate(nowhere)
    assert "secret" not in str(caught.value)
    missing_database = pg_url.replace("/postgres?", "/no_such_database?")
    with pytest.raises(ConfigurationError, match="no_such_database"):
        await migration_status(missing_database)


def test_urls_of_the_accepted_forms_pass_and_passwords_are_masked() -> None:
    for url in [
        "postgresql://kf:pw@db.example:5432/kf",
        "postgres://kf@localhost/kf",
        "postgresql://postgres:@/postgres?host=/tmp/sock",
    ]:
        assert check_database_url(url) == url
    assert mask_password("postgresql://kf:pw@db:5432/kf?sslmode=require") == (
        "postgresql://kf:***@db:5432/kf?sslmode=require"
    )
    assert mask_password("postgresql://postgres:@/postgres?host=/s") == "postgresql://postgres:@/postgres?host=/s"


def test_kf_db_migrate_and_status(
    fresh_db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the db commands: this test is about them, not about the other command groups importing.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["cli.db"])
    monkeypatch.delenv("KF_DATABASE_URL", raising=False)
    assert main(["db", "status", "--database-url", fresh_db_url]) == 1  # pending
    assert "pending  0001_event_store.sql" in capsys.readouterr().out
    assert main(["db", "migrate", "--database-url", fresh_db_url]) == 0
    assert "0002_projections.sql" in capsys.readouterr().out
    monkeypatch.setenv("KF_DATABASE_URL", fresh_db_url)
    assert main(["db", "migrate"]) == 0
    assert "is up to date" in capsys.readouterr().out
    assert main(["db", "status"]) == 0
    assert "applied  0001_event_store.sql" in capsys.readouterr().out
    assert main(["db", "migrate", "--database-url", "mysql://root:hunter2@db/kf"]) == 2
    err = capsys.readouterr().err
    assert "malformed database URL" in err and "hunter2" not in err


def test_kf_db_without_a_database_says_how_to_get_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["cli.db"])
    monkeypatch.delenv("KF_DATABASE_URL", raising=False)
    monkeypatch.setenv("KF_HOME", str(tmp_path / "never-started"))
    assert main(["db", "status"]) == 3  # a service that does not run: the machine's failure (cli/exit_status.py)
    assert "kf up" in capsys.readouterr().err
