"""Where the servers are: the one place clients (workers, the CLI, the event store) ask.

``KF_DATABASE_URL`` and ``KF_TEMPORAL_ADDRESS`` win when set (docker-compose, a real cluster). Otherwise
the answer is the embedded server that ``kf up`` started for the state folder (``KF_HOME``), read from
its pid file; asking while it does not run is an error that says to run ``kf up`` (ServiceUnavailable:
``kf`` exits 3, as for a server that does not answer).

The database has two URLs: :func:`database_url`, the role everything but migrations connects as (it may
only append to and read the log), and :func:`database_owner_url`, the role that owns the log and runs the
migrations (engine/evidence/roles.py).
"""

from __future__ import annotations

from pathlib import Path

from engine.config import database_owner_url_override, database_url_override, temporal_address_override
from engine.errors import ServiceUnavailable
from engine.services import elsewhere, postgres_server, temporal_server
from engine.services.paths import StatePaths
from engine.services.pidfile import PostgresPidFile


def database_url(home: Path | None = None) -> str:
    """The Postgres URL of the event log, as the application's role: KF_DATABASE_URL, else the embedded
    server of ``home``."""
    override = database_url_override()
    if override:
        return override
    return _embedded_postgres(home).url


def database_owner_url(home: Path | None = None) -> str:
    """The Postgres URL of the event log, as the role that owns it and runs the migrations:
    KF_DATABASE_OWNER_URL, else KF_DATABASE_URL (one role for both: it can then rewrite the log, and `kf up`
    says so), else the embedded server of ``home``."""
    override = database_owner_url_override() or database_url_override()
    if override:
        return override
    return _embedded_postgres(home).owner_url


def _embedded_postgres(home: Path | None) -> PostgresPidFile:
    paths = StatePaths.of(home)
    record = postgres_server.running(paths, [])
    if record is None:
        raise ServiceUnavailable(
            f"the embedded Postgres of {paths.home} is not running; run `kf up` first "
            f"(or set KF_DATABASE_URL to use another server){elsewhere.hint(paths)}"
        )
    return record


def temporal_address(home: Path | None = None) -> str:
    """``host:port`` of the Temporal frontend: KF_TEMPORAL_ADDRESS, else the embedded dev server of ``home``."""
    override = temporal_address_override()
    if override:
        return override
    paths = StatePaths.of(home)
    record = temporal_server.running(paths, [])
    if record is None:
        raise ServiceUnavailable(
            f"the embedded Temporal dev server of {paths.home} is not running; run `kf up` first "
            f"(or set KF_TEMPORAL_ADDRESS to use another server){elsewhere.hint(paths)}"
        )
    return f"{record.ip}:{record.port}"
