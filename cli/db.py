"""``kf db migrate`` and ``kf db status``: the event database's schema."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from engine import connections
from engine.database_url import mask_password
from engine.evidence.migrations import MIGRATIONS_DIR, migrate, migration_status


def register(subparsers: Any) -> None:
    db = subparsers.add_parser("db", help="the event database: apply and inspect migrations")
    commands = db.add_subparsers(dest="db_command", metavar="COMMAND", required=True)
    for name, handler, help_text in (
        ("migrate", _migrate, "apply pending migrations (safe to repeat)"),
        ("status", _status, "list migrations: applied, pending, edited or missing"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument(
            "--database-url",
            default=None,
            help="Postgres URL of the role that owns the event log (default: KF_DATABASE_OWNER_URL, else "
            "KF_DATABASE_URL, else the embedded database of `kf up`)",
        )
        command.add_argument(
            "--migrations-dir",
            type=Path,
            default=MIGRATIONS_DIR,
            help="folder of NNNN_name.sql files (default: the migrations installed with kernel-factory)",
        )
        command.add_argument("--json", action="store_true", help="print the report as one JSON object")
        command.set_defaults(handler=handler)


def _database_url(args: argparse.Namespace) -> str:
    # Migrations create and alter the log's objects: they run as its owner. --database-url, else
    # KF_DATABASE_OWNER_URL, else KF_DATABASE_URL, else the embedded server `kf up` started (a clear error if none).
    return str(args.database_url) if args.database_url else connections.database_owner_url()


def _migrate(args: argparse.Namespace) -> int:
    url = _database_url(args)
    applied = asyncio.run(migrate(url, args.migrations_dir))
    if args.json:
        print(json.dumps({"database": mask_password(url), "applied": applied}))
    elif applied:
        print(f"applied {len(applied)} migration(s) to {mask_password(url)}:")
        for name in applied:
            print(f"  {name}")
    else:
        print(f"{mask_password(url)} is up to date")
    return 0


def _status(args: argparse.Namespace) -> int:
    url = _database_url(args)
    states = asyncio.run(migration_status(url, args.migrations_dir))
    # Non-zero when the database is not exactly at the files' state, so scripts can check it.
    up_to_date = all(state.state == "applied" for state in states)
    if args.json:
        body = [state.model_dump(mode="json") for state in states]
        print(json.dumps({"database": mask_password(url), "up_to_date": up_to_date, "migrations": body}))
        return 0 if up_to_date else 1
    print(f"migrations of {mask_password(url)}:")
    for state in states:
        when = f"  applied {state.applied_at:%Y-%m-%d %H:%M:%S}" if state.applied_at else ""
        print(f"  {state.state:8} {state.name}{when}")
    if not states:
        print("  (no migration files)")
    return 0 if up_to_date else 1
