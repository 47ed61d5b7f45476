"""What `kf up`, `kf down` and `kf status` report: the state of each server and what the command did."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field


class ServiceState(StrEnum):
    """Whether a server of the embedded default runs."""

    RUNNING = "running"
    """The embedded server of this state folder runs."""
    STOPPED = "stopped"
    """The embedded server of this state folder does not run."""
    EXTERNAL = "external"
    """The user points at their own server (KF_DATABASE_URL / KF_TEMPORAL_ADDRESS); kf leaves it alone."""


class ServiceStatus(BaseModel):
    """One server: Temporal or Postgres."""

    name: str
    """``temporal`` or ``postgres``."""
    state: ServiceState
    """Running, stopped, or external (not managed by kf)."""
    address: str | None = None
    """Where clients connect: ``host:port`` for Temporal, the URL for Postgres; None when stopped."""
    pid: int | None = None
    """Process id of the embedded server while it runs."""
    reachable: bool | None = None
    """For an external server: whether it accepted a connection just now; None for embedded ones."""
    ui_url: str | None = None
    """Temporal only: the Web UI while the embedded dev server runs."""
    log: Path | None = None
    """The embedded server's log file."""

    @property
    def ok(self) -> bool:
        """True when clients can use this server: it runs here, or it is external and answers."""
        return self.state is ServiceState.RUNNING or (self.state is ServiceState.EXTERNAL and self.reachable is True)

    def describe(self) -> str:
        """One line for people, e.g. ``running (pid 42) at 127.0.0.1:7233``."""
        line = self.state.value
        if self.pid is not None:
            line += f" (pid {self.pid})"
        if self.address:
            line += f" at {self.address}"
        if self.state is ServiceState.EXTERNAL:
            line += ", reachable" if self.reachable else ", NOT reachable"
        return line


class QueueWorkers(BaseModel):
    """Who polls one of Kernel Factory's task queues, as Temporal saw it: the workers a search's steps wait for."""

    task_queue: str
    """The queue (``kf-control``, ``kf-build``, ``kf-cpu-x86_64-avx512``, …)."""
    kind: str
    """``workflow`` (the control queue's searches) or ``activity`` (steps)."""
    pollers: list[str] = Field(default_factory=list)
    """Identities of the workers that polled it lately (``pid@host``), as Temporal lists them."""
    last_poll: datetime | None = None
    """When one last polled it, by Temporal's clock; None when none has lately."""


class ServicesStatus(BaseModel):
    """Both servers of a state folder, and what the command that produced this report did."""

    home: Path
    """The state folder (KF_HOME)."""
    temporal: ServiceStatus
    """The Temporal frontend."""
    postgres: ServiceStatus
    """The Postgres server holding the event log."""
    notes: list[str] = Field(default_factory=list)
    """What the command did or found, in order: started, already running, stale pid file removed…"""
    workers: list[QueueWorkers] | None = None
    """Who polls the queues of a search on this machine (control, its CPU target, builds); None when Temporal does
    not run here or could not say."""
    workers_unknown: str | None = None
    """Why the workers could not be listed while Temporal runs (it did not answer in time), else None."""
    elsewhere: list[Path] = Field(default_factory=list)
    """Other state folders whose embedded servers run, looked for only when a server of this one is stopped:
    ``kf`` run from another folder than ``kf up`` (KF_HOME defaults to ``.kf`` where a command runs)."""

    @property
    def all_running(self) -> bool:
        """True when both servers can be used."""
        return self.temporal.ok and self.postgres.ok
