"""The embedded default: a Temporal dev server and a Postgres, with all their state under one folder.

``kf up`` / ``kf down`` / ``kf status`` call ``up`` / ``down`` / ``status``. With ``KF_TEMPORAL_ADDRESS`` or
``KF_DATABASE_URL`` set, the corresponding server is the user's ("external"): it is never started or
stopped here, though ``up`` still applies migrations to the external database. Clients find either kind
through ``engine.connections``.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib.util
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine import connections
from engine.services import elsewhere, postgres_server, temporal_server
from engine.services.paths import StatePaths
from engine.services.status import ServicesStatus, ServiceState, ServiceStatus
from engine.services.temporal_server import SEARCH_ATTRIBUTES, temporal_binary

__all__ = [
    "SEARCH_ATTRIBUTES",
    "ServiceState",
    "ServiceStatus",
    "ServicesStatus",
    "StatePaths",
    "down",
    "status",
    "temporal_binary",
    "up",
]


def up(home: Path | None = None) -> ServicesStatus:
    """Start whatever of the two servers does not run yet, then apply migrations. Safe to repeat."""
    paths = StatePaths.of(home)
    with _exclusive(paths):
        return _up(paths)


def _up(paths: StatePaths) -> ServicesStatus:
    notes: list[str] = []
    # The dev server takes a few seconds to open its ports: launch it first, start Postgres and migrate
    # meanwhile, then wait for it.
    launched = temporal_server.launch(paths, notes)
    try:
        postgres_server.start(paths, notes)
        _migrate(connections.database_owner_url(paths.home), notes)
        _check_application_role(connections.database_url(paths.home), notes)
    finally:
        if launched is not None:
            temporal_server.wait_ready(paths, launched)
    temporal_server.register_search_attributes(paths, notes)
    return _report(paths, notes)


def down(home: Path | None = None) -> ServicesStatus:
    """Stop both embedded servers; their data stays for the next ``up``."""
    paths = StatePaths.of(home)
    notes: list[str] = []
    with _exclusive(paths):
        temporal_server.stop(paths, notes)
        postgres_server.stop(paths, notes)
        return _report(paths, notes)


def status(home: Path | None = None) -> ServicesStatus:
    """What runs and what does not. Stale pid files found on the way are removed (and noted)."""
    paths = StatePaths.of(home)
    return _report(paths, [])


@contextmanager
def _exclusive(paths: StatePaths) -> Iterator[None]:
    """One `kf up` or `kf down` at a time per state folder: two at once would both start a server."""
    paths.run.mkdir(parents=True, exist_ok=True)
    with (paths.run / "kf.lock").open("w") as lock:
        # Released by the kernel when this process exits, however it exits: no stale lock to clean.
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _report(paths: StatePaths, notes: list[str]) -> ServicesStatus:
    report = ServicesStatus(
        home=paths.home,
        temporal=temporal_server.status(paths, notes),
        postgres=postgres_server.status(paths, notes),
        notes=notes,
    )
    if ServiceState.STOPPED in (report.temporal.state, report.postgres.state):
        report.elsewhere = elsewhere.other_state_folders(paths)
    return report


def _migrate(database_url: str, notes: list[str]) -> None:
    # engine.evidence.migrations is written alongside this module; until it lands, `kf up` still starts servers.
    if importlib.util.find_spec("engine.evidence.migrations") is None:
        notes.append("Migrations: engine.evidence.migrations is not available yet; skipped")
        return
    from engine.evidence.migrations import migrate

    applied = _run(migrate(database_url))
    notes.append(f"Migrations: applied {', '.join(applied)}" if applied else "Migrations: up to date")


def _check_application_role(database_url: str, notes: list[str]) -> None:
    """Note a warning when the application's URL names a role that could rewrite the event log."""
    from engine.database_url import connect
    from engine.evidence.roles import rewrite_privileges, rewrite_warning

    async def check() -> list[str]:
        connection = await connect(database_url)
        try:
            held = await rewrite_privileges(connection)
            return [rewrite_warning(await connection.fetchval("SELECT current_user"), held)] if held else []
        finally:
            await connection.close()

    notes.extend(f"Postgres: warning: {warning}" for warning in _run(check()))


def _run(coroutine: Coroutine[Any, Any, list[str]]) -> list[str]:
    """Run a coroutine to completion from synchronous code, even when called inside an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
