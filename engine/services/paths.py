"""Where the embedded services keep their files inside the state folder (``KF_HOME``, default ``.kf``).

::

    <home>/temporal/temporal.db     the dev server's SQLite store: workflows survive a restart
    <home>/postgres/                Postgres data directory (PGDATA)
    <home>/logs/temporal.log        everything the dev server printed
    <home>/logs/postgres.log        the Postgres server log
    <home>/run/temporal.json        pid file of the dev server, with the ports it listens on
    <home>/run/postgres.json        the URL of the running embedded Postgres
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config import kf_home


@dataclass(frozen=True)
class StatePaths:
    """The files of the embedded services under one state folder."""

    home: Path

    @classmethod
    def of(cls, home: Path | None = None) -> StatePaths:
        """The paths under ``home``, or under ``KF_HOME`` when ``home`` is None."""
        return cls((home if home is not None else kf_home()).resolve())

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def temporal_db(self) -> Path:
        return self.home / "temporal" / "temporal.db"

    @property
    def temporal_log(self) -> Path:
        return self.logs / "temporal.log"

    @property
    def temporal_pidfile(self) -> Path:
        return self.run / "temporal.json"

    @property
    def postgres_data(self) -> Path:
        return self.home / "postgres"

    @property
    def postgres_log(self) -> Path:
        return self.logs / "postgres.log"

    @property
    def postgres_pidfile(self) -> Path:
        return self.run / "postgres.json"

    def create(self) -> None:
        """Create the folders the services write into."""
        for folder in (self.logs, self.run, self.temporal_db.parent):
            folder.mkdir(parents=True, exist_ok=True)
