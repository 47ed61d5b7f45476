"""The embedded Postgres: the server binaries bundled in the pgserver package, data in the state folder.

pgserver's own ``get_server`` stops the server when the Python process that asked for it exits. ``kf up``
must leave Postgres running after the command returns, so this module drives the bundled ``initdb`` and
``pg_ctl`` directly: ``pg_ctl start`` detaches the postmaster into its own session.

The server listens on a Unix socket only (no TCP port, so no port to collide with), in its data directory
when the path is short enough for a socket name, else in a short folder under the temp directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shlex
import socket
import stat
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from engine.config import database_url_override
from engine.database_url import mask_password
from engine.errors import ConfigurationError, ServiceError
from engine.evidence.roles import APP_ROLE, CREATE_ROLES_SQL, OWNER_ROLE
from engine.services import logs, pidfile, processes
from engine.services.paths import StatePaths
from engine.services.pidfile import PostgresPidFile
from engine.services.status import ServiceState, ServiceStatus

ROLE = "postgres"
"""The superuser role initdb creates, and the database the URLs name. Only ``kf up`` connects as it, to
create the two roles everything else connects as (engine/evidence/roles.py)."""
SOCKET_PORT = 5432
"""Only names the socket file ``.s.PGSQL.5432``: no TCP port is opened."""
SYSTEM_USER_WHEN_ROOT = "pgserver"
"""Postgres refuses to run as root; as root, run it as this user (the one pgserver itself uses)."""
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


def binaries() -> Path:
    """The folder of Postgres executables bundled in the pgserver package."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        raise ConfigurationError("the pgserver package is not installed; install it with `pip install pgserver`")
    return Path(spec.origin).parent / "pginstall" / "bin"


def running(paths: StatePaths, notes: list[str]) -> PostgresPidFile | None:
    """The pid file of this state folder's running Postgres, or None. Stale state is cleaned up."""
    postmaster = _read_postmaster_pid(paths.postgres_data)
    if postmaster is None:
        if paths.postgres_pidfile.exists():
            pidfile.remove(paths.postgres_pidfile)
            notes.append(f"Postgres: removed stale pid file {paths.postgres_pidfile} (the server was not running)")
        return None
    pid, socket_dir = postmaster
    if _is_ours(processes.command_line(pid), paths):
        record = pidfile.load(paths.postgres_pidfile, PostgresPidFile, notes)
        if record is None or record.pid != pid or not record.owner_url:
            record = _record(paths, pid, socket_dir)
            pidfile.save(paths.postgres_pidfile, record)
        return record
    pidfile.remove(paths.postgres_pidfile)
    lock = paths.postgres_data / "postmaster.pid"
    if processes.is_alive(pid):
        # The pid now belongs to another program: Postgres would refuse to start ("is another
        # postmaster running?"), so the lock file must go. Postgres removes one with a dead pid itself,
        # after checking no orphaned backend still uses the shared memory: that check we leave to it.
        lock.unlink(missing_ok=True)
        notes.append(f"Postgres: removed stale {lock}: {processes.describe(pid)} is not this folder's Postgres")
    else:
        notes.append(f"Postgres: found stale {lock} (pid {pid} is not running); Postgres will replace it")
    return None


def status(paths: StatePaths, notes: list[str]) -> ServiceStatus:
    """Whether this state folder's Postgres runs (or the external server answers)."""
    external = database_url_override()
    if external:
        return ServiceStatus(
            name="postgres",
            state=ServiceState.EXTERNAL,
            address=mask_password(external),
            reachable=_reachable(external),
        )
    record = running(paths, notes)
    if record is None:
        return ServiceStatus(name="postgres", state=ServiceState.STOPPED, log=paths.postgres_log)
    return ServiceStatus(
        name="postgres", state=ServiceState.RUNNING, address=record.url, pid=record.pid, log=paths.postgres_log
    )


def start(paths: StatePaths, notes: list[str]) -> None:
    """Initialise the data directory if new and start Postgres, unless it runs or is external."""
    if database_url_override():
        notes.append("Postgres: external (KF_DATABASE_URL); not started")
        return
    record = running(paths, notes)
    if record is not None:
        notes.append(f"Postgres: already running (pid {record.pid})")
        # It may have been started by a version of kf that connected as the superuser.
        _create_roles(record, _system_user())
        return
    paths.create()
    user = _system_user()
    data = paths.postgres_data
    data.mkdir(mode=0o700, exist_ok=True)
    log = paths.postgres_log
    log.touch()
    if user is not None:
        _hand_over(data, user)
        _hand_over(log, user)
    if not (data / "PG_VERSION").exists():
        if any(data.iterdir()):
            raise ServiceError(
                f"{data} holds no complete Postgres cluster (no PG_VERSION file): an interrupted first `kf up`? "
                "If it holds nothing you need, remove that folder and run `kf up` again"
            )
        _pg(["initdb", "-D", str(data), "-U", ROLE, "--auth=trust", "--encoding=UTF8", "--no-instructions"], user)
        notes.append(f"Postgres: created a new cluster in {data}")
    socket_dir = _socket_dir(data, user)
    log_start = logs.size(log)
    server_options = f"-c listen_addresses='' -k {shlex.quote(str(socket_dir))} -p {SOCKET_PORT}"
    try:
        _pg(
            [
                "pg_ctl",
                "start",
                "-D",
                str(data),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-l",
                str(log),
                "-o",
                server_options,
            ],
            user,
            timeout=START_TIMEOUT_S + 10,
        )
    except ServiceError as error:
        raise ServiceError(
            f"Postgres did not start: {error}\nLast lines of {log}:\n{logs.tail(log, log_start)}\n"
            "Fix the cause and run `kf up` again: it starts only what does not run."
        ) from None
    postmaster = _read_postmaster_pid(data)
    if postmaster is None:
        raise ServiceError(f"Postgres started but wrote no {data / 'postmaster.pid'}; see {log}")
    record = _record(paths, *postmaster)
    _create_roles(record, user)
    pidfile.save(paths.postgres_pidfile, record)
    notes.append(f"Postgres: started (pid {record.pid})")


def stop(paths: StatePaths, notes: list[str]) -> None:
    """Stop this state folder's Postgres (fast shutdown: sessions are ended, data is kept)."""
    if database_url_override():
        notes.append("Postgres: external (KF_DATABASE_URL); left alone")
        return
    record = running(paths, notes)
    if record is None:
        notes.append("Postgres: not running")
        return
    user = _system_user()
    stop = ["pg_ctl", "stop", "-D", str(paths.postgres_data), "-w", "-t", str(STOP_TIMEOUT_S)]
    try:
        _pg([*stop, "-m", "fast"], user, timeout=STOP_TIMEOUT_S + 10)
        notes.append(f"Postgres: stopped (pid {record.pid})")
    except ServiceError:
        # Fast shutdown waits for running transactions to roll back; immediate does not (Postgres then
        # recovers from its WAL on the next start, losing no committed data).
        with contextlib.suppress(ServiceError):
            _pg([*stop, "-m", "immediate"], user, timeout=STOP_TIMEOUT_S + 10)
        if processes.is_alive(record.pid):
            processes.terminate(record.pid, 5.0)
        notes.append(f"Postgres: stopped (pid {record.pid}) by an immediate shutdown after fast shutdown failed")
    pidfile.remove(paths.postgres_pidfile)


def _create_roles(record: PostgresPidFile, user: str | None) -> None:
    """Create the owner and application roles (as the superuser, over the socket); safe to repeat.

    Why roles on a server only this machine's user can reach: the socket accepts whichever role a client
    names, so they do not keep a hostile process of that user out (the witness in Temporal's history is
    what catches a rewrite). They keep honest code honest: the workers, the CLI and anything that borrows
    their URL can append and read, not change what was recorded, exactly as on a shared server."""
    _pg(
        [
            "psql",
            "--no-psqlrc",
            "--quiet",
            "--set=ON_ERROR_STOP=1",
            f"--host={record.socket_dir}",
            f"--port={SOCKET_PORT}",
            f"--username={ROLE}",
            f"--dbname={ROLE}",
            f"--command={CREATE_ROLES_SQL}",
        ],
        user,
    )


def _record(paths: StatePaths, pid: int, socket_dir: Path) -> PostgresPidFile:
    where = f"{ROLE}?host={quote(str(socket_dir), safe='/')}&port={SOCKET_PORT}"
    return PostgresPidFile(
        pid=pid,
        url=f"postgresql://{APP_ROLE}@/{where}",
        owner_url=f"postgresql://{OWNER_ROLE}@/{where}",
        socket_dir=str(socket_dir),
        data_dir=str(paths.postgres_data),
        started_at=datetime.now(UTC),
    )


def _read_postmaster_pid(data: Path) -> tuple[int, Path] | None:
    """(postmaster pid, socket folder) from PGDATA/postmaster.pid, or None when there is none."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    # Line 1: pid; line 5: the first socket folder (see PostgreSQL's pidfile.h).
    if not lines or not lines[0].strip().isdigit():
        return None
    socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else data
    return int(lines[0]), socket_dir


def _is_ours(argv: list[str] | None, paths: StatePaths) -> bool:
    return argv is not None and Path(argv[0]).name == "postgres" and str(paths.postgres_data) in argv


def _socket_dir(data: Path, user: str | None) -> Path:
    if len(str(data / f".s.PGSQL.{SOCKET_PORT}")) <= _SOCKET_PATH_MAX:
        return data
    digest = hashlib.sha256(str(data).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"kf-pg-{digest}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        _hand_over(folder, user)
    return folder


def _system_user() -> str | None:
    """None normally; as root, the unprivileged user Postgres runs as (created if missing)."""
    if os.geteuid() != 0:
        return None
    import pwd  # POSIX only

    try:
        pwd.getpwnam(SYSTEM_USER_WHEN_ROOT)
    except KeyError:
        created = subprocess.run(
            ["useradd", "--system", "--user-group", "--shell", "/usr/sbin/nologin", SYSTEM_USER_WHEN_ROOT],
            capture_output=True,
            text=True,
            check=False,
        )
        if created.returncode != 0:
            raise ServiceError(
                f"Postgres cannot run as root and creating the user {SYSTEM_USER_WHEN_ROOT!r} to run it as "
                f"failed: {created.stderr.strip()}; create that user, or run kf as a normal user"
            ) from None
    return SYSTEM_USER_WHEN_ROOT


def _hand_over(path: Path, user: str) -> None:
    """Let ``user`` own ``path`` and reach it (its ancestors get o+x, the binaries' ancestors too)."""
    import pwd  # POSIX only

    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    for folder in [*path.resolve().parents, *binaries().resolve().parents]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            folder.chmod(mode | stat.S_IXOTH)


def _pg(argv: list[str], user: str | None, timeout: float = 120.0) -> str:
    """Run a bundled Postgres tool; its output, or ServiceError with what it printed."""
    command = [str(binaries() / argv[0]), *argv[1:]]
    # Output goes to files, not pipes: the postmaster pg_ctl starts could inherit a pipe and keep it
    # open, and reading it would then never finish.
    with tempfile.TemporaryFile("w+") as output:
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                # As root, drop to the user and its group entirely: with root's group kept, the group bits
                # of root-owned folders would deny it the traversal their "other" bits allow.
                user=user,
                group=user,
                extra_groups=[] if user is not None else None,
                cwd="/",
                start_new_session=True,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise ServiceError(f"`{argv[0]}` did not finish within {timeout:.0f} s") from error
        output.seek(0)
        printed = output.read().strip()
    if result.returncode != 0:
        said = "\n".join(f"    {line}" for line in printed.splitlines()) or "    (no output)"
        raise ServiceError(f"`{argv[0]} {argv[1]}` failed with exit status {result.returncode}:\n{said}")
    return printed


def _reachable(url: str) -> bool:
    """Whether the server of a Postgres URL accepts a connection (TCP, or its Unix socket)."""
    try:
        parts = urlsplit(url)
        query = dict(pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair)
        host = unquote(query.get("host", "")) or parts.hostname or "localhost"
        port = int(query.get("port", "") or parts.port or 5432)
    except ValueError:
        return False
    try:
        if host.startswith("/"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(f"{host}/.s.PGSQL.{port}")
        else:
            socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True
