"""Pid files of the embedded servers: which process runs a server and how to reach it.

A pid file is a small JSON record written when a server starts and removed when it stops. It is only a
claim: the process may have died since (a crash, a reboot) or its pid may now belong to another program.
Callers check the claim against the running process (``engine.services.processes``) before trusting it.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError


class TemporalPidFile(BaseModel):
    """The running Temporal dev server of a state folder."""

    pid: int
    """Process id of the ``temporal server start-dev`` process."""
    ip: str
    """Address its gRPC frontend and Web UI listen on."""
    port: int
    """gRPC frontend port: what workers and clients connect to."""
    ui_port: int
    """Web UI port."""
    db_filename: str
    """Its SQLite store; together with the pid this identifies the process as ours."""
    started_at: datetime
    """When ``kf up`` started it."""


class PostgresPidFile(BaseModel):
    """The running embedded Postgres of a state folder."""

    pid: int
    """Process id of the postmaster (first line of ``postmaster.pid``)."""
    url: str
    """Connection URL of the application's role (a Unix socket: the embedded server listens on no TCP port)."""
    owner_url: str = ""
    """Connection URL of the role that owns the event log and runs the migrations; empty in pid files written
    before the two roles existed (they are rewritten)."""
    socket_dir: str
    """Folder holding its Unix socket ``.s.PGSQL.5432``."""
    data_dir: str
    """Its data directory (PGDATA)."""
    started_at: datetime
    """When ``kf up`` started it (or first saw it running)."""


Record = TypeVar("Record", TemporalPidFile, PostgresPidFile)


def load(path: Path, model: type[Record], notes: list[str]) -> Record | None:
    """The record in ``path``; None if there is none. An unreadable file is removed and noted."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return model.model_validate_json(text)
    except ValidationError:
        # A half-written or hand-edited file proves nothing about a running server; the caller
        # finds a still-running server another way (the port, postmaster.pid), so dropping it is safe.
        path.unlink(missing_ok=True)
        notes.append(f"removed unreadable pid file {path}")
        return None


def save(path: Path, record: TemporalPidFile | PostgresPidFile) -> None:
    """Write ``record`` to ``path`` atomically, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(record.model_dump_json(indent=2) + "\n")
    os.replace(partial, path)


def remove(path: Path) -> None:
    """Remove a pid file if it exists."""
    path.unlink(missing_ok=True)
