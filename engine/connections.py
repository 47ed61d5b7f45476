"""Where the servers are: the one place clients (workers, the CLI, the event store) ask.

``KF_DATABASE_URL`` and ``KF_TEMPORAL_ADDRESS`` win when set (docker-compose, a real cluster). Otherwise
the answer is the embedded server that ``kf up`` started for the state folder (``KF_HOME``), read from
its pid file; asking while it does not run is an error that says to run ``kf up``.
"""

from __future__ import annotations

from pathlib import Path

from engine.config import database_url_override, temporal_address_override
from engine.errors import ConfigurationError
from engine.services import postgres_server, temporal_server
from engine.services.paths import StatePaths


def database_url(home: Path | None = None) -> str:
    """The Postgres URL of the event log: KF_DATABASE_URL, else the embedded server of ``home``."""
    override = database_url_override()
    if override:
        return override
    paths = StatePaths.of(home)
    record = postgres_server.running(paths, [])
    if record is None:
        raise ConfigurationError(
            f"the embedded Postgres of {paths.home} is not running; run `kf up` first "
            "(or set KF_DATABASE_URL to use another server)"
        )
    return record.url


def temporal_address(home: Path | None = None) -> str:
    """``host:port`` of the Temporal frontend: KF_TEMPORAL_ADDRESS, else the embedded dev server of ``home``."""
    override = temporal_address_override()
    if override:
        return override
    paths = StatePaths.of(home)
    record = temporal_server.running(paths, [])
    if record is None:
        raise ConfigurationError(
            f"the embedded Temporal dev server of {paths.home} is not running; run `kf up` first "
            "(or set KF_TEMPORAL_ADDRESS to use another server)"
        )
    return f"{record.ip}:{record.port}"
