"""`kf up` / `kf status` / `kf down` on the real binaries: the temporal dev server and pgserver's Postgres.

Every test gets its own state folder and free ports, and its servers are stopped in teardown even when
the test fails. The CLI runs as a subprocess, as a user runs it: the servers must outlive it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from engine import connections, services
from engine.errors import ConfigurationError
from engine.services import elsewhere, processes
from engine.services.paths import StatePaths

pytestmark = pytest.mark.slow

KF = Path(sys.executable).parent / "kf"
TEMPORAL = str(services.temporal_binary())


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999).

    A port the kernel hands out for port 0 comes from the ephemeral range, where the dev server's own
    internal listeners and every outgoing connection also draw theirs: between this probe and `kf up`
    binding it, the port could be taken (seen as a flaky "address already in use" on the UI port)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


@dataclass
class Kf:
    """The kf command line pointed at one test's state folder and ports."""

    paths: StatePaths
    env: dict[str, str]

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KF), *args], env=self.env, capture_output=True, text=True, timeout=120)

    def status(self) -> dict[str, Any]:
        result = self("status", "--json")
        assert result.returncode in (0, 3), result.stderr
        report: dict[str, Any] = json.loads(result.stdout)
        return report

    def states(self) -> tuple[str, str]:
        report = self.status()
        return report["temporal"]["state"], report["postgres"]["state"]

    def temporal(self, *args: str) -> subprocess.CompletedProcess[str]:
        address = f"127.0.0.1:{self.env['KF_TEMPORAL_PORT']}"
        return subprocess.run(
            [TEMPORAL, *args, "--address", address], capture_output=True, text=True, timeout=60, check=False
        )


@pytest.fixture
def kf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kf]:
    env = dict(os.environ)
    for variable in ("KF_DATABASE_URL", "KF_TEMPORAL_ADDRESS", "KF_TEMPORAL_NAMESPACE"):
        env.pop(variable, None)
        monkeypatch.delenv(variable, raising=False)
    env |= {
        "KF_HOME": str(tmp_path / "kf"),
        "KF_TEMPORAL_PORT": str(free_port()),
        "KF_TEMPORAL_UI_PORT": str(free_port()),
    }
    for variable in ("KF_HOME", "KF_TEMPORAL_PORT", "KF_TEMPORAL_UI_PORT"):
        monkeypatch.setenv(variable, env[variable])
    runner = Kf(StatePaths.of(tmp_path / "kf"), env)
    try:
        yield runner
    finally:
        services.down(runner.paths.home)


async def count_rows(url: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        count: int = await connection.fetchval("SELECT count(*) FROM kf_test_survivors")
        return count
    finally:
        await connection.close()


async def test_up_status_down_up_keeps_the_data(kf: Kf) -> None:
    started = kf("up")
    assert started.returncode == 0, started.stderr
    assert "Temporal: started" in started.stdout and "Postgres: started" in started.stdout
    assert f"http://127.0.0.1:{kf.env['KF_TEMPORAL_UI_PORT']}" in started.stdout
    assert f"127.0.0.1:{kf.env['KF_TEMPORAL_PORT']}" in started.stdout
    assert "Migrations: applied" in started.stdout
    # The embedded server has the two roles: the application's may append and read, not rewrite.
    assert "can rewrite the event log" not in started.stdout

    running = kf("status")
    assert running.returncode == 0, running.stdout
    assert kf.states() == ("running", "running")
    assert connections.temporal_address() == f"127.0.0.1:{kf.env['KF_TEMPORAL_PORT']}"

    attributes = json.loads(kf.temporal("operator", "search-attribute", "list", "--output", "json").stdout)
    assert set(services.SEARCH_ATTRIBUTES) <= set(attributes["customAttributes"])

    # Closed searches are kept a month, not the dev server's day; a `kf up` with another retention applies it.
    def retention() -> str:
        described = kf.temporal("operator", "namespace", "describe", "--output", "json", "--namespace", "default")
        return str(json.loads(described.stdout)["config"]["workflowExecutionRetentionTtl"])

    assert retention() == f"{30 * 86400}s" and "closed searches are kept 30 days" in started.stdout
    kf.env["KF_TEMPORAL_RETENTION_DAYS"] = "2"
    shorter = kf("up")
    assert shorter.returncode == 0 and "closed searches are kept 2 days" in shorter.stdout, shorter.stdout
    assert retention() == f"{2 * 86400}s"
    del kf.env["KF_TEMPORAL_RETENTION_DAYS"]

    # The owner creates tables; the application's role (database_url) may only read and insert into them.
    connection = await asyncpg.connect(connections.database_owner_url())
    try:
        await connection.execute("CREATE TABLE kf_test_survivors (id int PRIMARY KEY)")
        await connection.execute("INSERT INTO kf_test_survivors VALUES (1), (2), (3)")
    finally:
        await connection.close()
    workflow = kf.temporal("workflow", "start", "--type", "Nothing", "--task-queue", "kf-test", "-w", "survivor")
    assert workflow.returncode == 0, workflow.stderr

    stopped = kf("down")
    assert stopped.returncode == 0, stopped.stderr
    assert "Temporal: stopped" in stopped.stdout and "Postgres: stopped" in stopped.stdout
    assert kf("status").returncode == 3
    assert kf.states() == ("stopped", "stopped")
    with pytest.raises(ConfigurationError, match="kf up"):
        connections.database_url()
    with pytest.raises(ConfigurationError, match="kf up"):
        connections.temporal_address()

    again = kf("up")
    assert again.returncode == 0, again.stderr
    assert "Migrations: up to date" in again.stdout
    assert await count_rows(connections.database_url()) == 3
    described = kf.temporal("workflow", "describe", "-w", "survivor", "--output", "json")
    assert described.returncode == 0, described.stderr

    # The same servers seen as external ones (as docker-compose's one-shot `kf up` sees them): nothing is
    # started, migrations are checked, and a search attribute missing from the namespace is registered.
    removed = kf.temporal("operator", "search-attribute", "remove", "--name", "BestSpeedup", "--yes")
    assert removed.returncode == 0, removed.stderr
    external = kf.env | {
        "KF_DATABASE_URL": connections.database_url(),
        "KF_DATABASE_OWNER_URL": connections.database_owner_url(),
        "KF_TEMPORAL_ADDRESS": connections.temporal_address(),
    }
    result = subprocess.run([str(KF), "up"], env=external, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Temporal: external" in result.stdout and "Postgres: external" in result.stdout
    assert "Migrations: up to date" in result.stdout
    assert "registered search attribute BestSpeedup (Double)" in result.stdout


def test_up_twice_reports_already_running(kf: Kf) -> None:
    # Even at the same moment: one starts the servers, the other finds them running.
    racing = [subprocess.Popen([str(KF), "up"], env=kf.env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=120)[0] for process in racing]
    assert [process.returncode for process in racing] == [0, 0], outputs
    assert sorted("Temporal: started" in output for output in outputs) == [False, True], outputs
    first = kf.status()
    second = kf("up")
    assert second.returncode == 0, second.stderr
    assert "Temporal: already running" in second.stdout and "Postgres: already running" in second.stdout
    assert kf.status()["temporal"] == first["temporal"] and kf.status()["postgres"] == first["postgres"]

    # A lost pid file does not make kf start a second server on the same store: it finds the first.
    kf.paths.temporal_pidfile.unlink()
    third = kf("up")
    assert third.returncode == 0, third.stderr
    assert "without a pid file" in third.stdout and "Temporal: already running" in third.stdout
    assert kf.status()["temporal"] == first["temporal"]


def test_kf_in_another_folder_names_the_state_folder_whose_servers_run(kf: Kf, tmp_path: Path) -> None:
    assert kf("up").returncode == 0
    # A user who ran `kf up` in one folder and then runs kf in another: KF_HOME unset, ./.kf of that folder.
    elsewhere_folder = tmp_path / "elsewhere"
    elsewhere_folder.mkdir()
    env = {key: value for key, value in kf.env.items() if key != "KF_HOME"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KF), *args], env=env, cwd=elsewhere_folder, capture_output=True, text=True, timeout=120
        )

    fix = f"set KF_HOME={kf.paths.home}"
    status = run("status")
    assert status.returncode == 3, status.stderr
    assert f"State folder: {elsewhere_folder / '.kf'}" in status.stdout
    assert f"Elsewhere: the embedded servers of {kf.paths.home} run; {fix} to use them" in status.stdout
    assert str(kf.paths.home) in json.loads(run("status", "--json").stdout)["elsewhere"]
    # Commands that need a server say where the running ones are, and still exit 3 (the service is missing).
    for command in (("search", "list"), ("lessons", "--problem", "softmax")):
        result = run(*command)
        assert result.returncode == 3, (command, result.stderr)
        # Other tests' servers may run too: then every folder is named, each with its KF_HOME.
        assert "run `kf up` first" in result.stderr and f"KF_HOME={kf.paths.home}" in result.stderr, command
    # `kf up` there meets the first folder's dev server on the port, and names it rather than "another process".
    up = run("up")
    assert up.returncode == 2, up.stderr
    assert f"held by the embedded dev server of another state folder, {kf.paths.home}" in up.stderr
    assert fix in up.stderr and "KF_TEMPORAL_PORT=" in up.stderr and "Traceback" not in up.stderr
    # Read from the processes that run, not remembered: once they stop, the folder is no longer named.
    assert kf("down").returncode == 0
    gone = run("status", "--json")
    assert gone.returncode == 3 and str(kf.paths.home) not in json.loads(gone.stdout)["elsewhere"]
    assert str(kf.paths.home) not in run("search", "list").stderr


def test_only_servers_that_kf_up_started_count_as_another_state_folder(tmp_path: Path) -> None:
    home = tmp_path / "kf"
    temporal = ["temporal", "server", "start-dev", "--db-filename", str(home / "temporal" / "temporal.db")]
    postgres = ["/opt/pg/bin/postgres", "-D", str(home / "postgres"), "-p", "5432"]
    # The layout alone is not enough: `kf up` leaves its pid files.
    assert elsewhere.state_folder_of(temporal) is None and elsewhere.state_folder_of(postgres) is None
    paths = StatePaths.of(home)
    paths.create()
    paths.temporal_pidfile.write_text("{}")
    paths.postgres_pidfile.write_text("{}")
    assert elsewhere.state_folder_of(temporal) == home and elsewhere.state_folder_of(postgres) == home
    # A dev server on another store, a Postgres of another data folder, other programs: not ours.
    assert elsewhere.state_folder_of([*temporal[:4], str(tmp_path / "own.db")]) is None
    assert elsewhere.state_folder_of(["/opt/pg/bin/postgres", "-D", str(home / "data")]) is None
    assert elsewhere.state_folder_of(["python", "-D", str(home / "postgres")]) is None
    assert elsewhere.state_folder_of([]) is None
    # The fix names the folder to run kf in only where the folder is the default `.kf`.
    assert elsewhere.fix_for(home) == f"set KF_HOME={home}"
    assert elsewhere.fix_for(tmp_path / ".kf") == f"set KF_HOME={tmp_path / '.kf'} (or run kf in {tmp_path})"


def test_status_does_not_hang_on_a_temporal_that_runs_but_does_not_answer(kf: Kf) -> None:
    assert kf("up").returncode == 0
    temporal_pid = kf.status()["temporal"]["pid"]
    os.kill(temporal_pid, signal.SIGSTOP)  # running by its pid file, answering nothing
    try:
        started = time.monotonic()
        result = kf("status")
        waited = time.monotonic() - started
        # An id the log holds nothing of: Temporal is asked for its witness and whether it knows the search, each
        # for seconds only (the client's own wait, about 30 s each, made this a minute).
        started = time.monotonic()
        unknown = kf("audit", "s-never-started")
        asked = time.monotonic() - started
        started = time.monotonic()
        listed = kf("search", "list")
        listing = time.monotonic() - started
    finally:
        os.kill(temporal_pid, signal.SIGCONT)
    assert unknown.returncode == 2, unknown.stderr
    assert "no events for search 's-never-started'" in unknown.stderr, unknown.stderr
    assert asked < 35, f"kf audit of an unknown id waited {asked:.0f} s for a Temporal that does not answer"
    # A command that needs Temporal says it is unreachable (exit 3) after INTERACTIVE_CONNECT_S, not the client's 30 s.
    assert listed.returncode == 3, listed.stderr
    assert "did not answer within 10 s" in listed.stderr, listed.stderr
    assert listing < 25, f"kf search list took {listing:.0f} s to say Temporal does not answer"
    # The servers' state decides the exit status; the workers are reported as unknown, not waited for.
    assert result.returncode == 0, result.stderr
    assert "Workers   unknown: Temporal did not list the workers" in result.stdout, result.stdout
    assert waited < 60, f"kf status took {waited:.0f} s"  # a hang guard: it gives Temporal 10 s
    assert "none polls kf-control" in kf("status").stdout  # answering again, it lists them


def test_half_started_up_starts_only_the_missing_server(kf: Kf) -> None:
    assert kf("up").returncode == 0
    postgres_pid = kf.status()["postgres"]["pid"]
    temporal_pid = kf.status()["temporal"]["pid"]
    os.kill(temporal_pid, signal.SIGKILL)  # a crash: the pid file stays behind
    processes.wait_for_exit(temporal_pid, 10)

    half = kf("status")
    assert half.returncode == 3
    assert "removed stale pid file" in half.stdout
    assert kf.states() == ("stopped", "running")

    resumed = kf("up")
    assert resumed.returncode == 0, resumed.stderr
    assert "Temporal: started" in resumed.stdout and "Postgres: already running" in resumed.stdout
    assert kf.states() == ("running", "running")
    assert kf.status()["postgres"]["pid"] == postgres_pid


def test_stale_pid_files_of_other_programs_are_cleaned_up(kf: Kf) -> None:
    # Pids reused by unrelated programs: trusting them would mean "already running" (Temporal) and
    # "another postmaster is running" (Postgres).
    assert kf("up").returncode == 0
    assert kf("down").returncode == 0
    impostor = subprocess.Popen(["sleep", "60"])
    try:
        kf.paths.temporal_pidfile.write_text(
            json.dumps(
                {
                    "pid": impostor.pid,
                    "ip": "127.0.0.1",
                    "port": int(kf.env["KF_TEMPORAL_PORT"]),
                    "ui_port": int(kf.env["KF_TEMPORAL_UI_PORT"]),
                    "db_filename": str(kf.paths.temporal_db),
                    "started_at": "2024-01-01T00:00:00Z",
                }
            )
        )
        postmaster = kf.paths.postgres_data / "postmaster.pid"
        postmaster.write_text(f"{impostor.pid}\n{kf.paths.postgres_data}\n1700000000\n5432\n\n\n\nready\n")

        result = kf("up")
        assert result.returncode == 0, result.stderr
        assert f"pid {impostor.pid} (`sleep 60`) is not this state folder's dev server" in result.stdout
        assert "Postgres: removed stale" in result.stdout
        assert kf.states() == ("running", "running")
        assert impostor.poll() is None, "kf must never signal a process it did not start"
    finally:
        impostor.kill()
        impostor.wait()


def test_pid_files_of_dead_or_unreadable_servers_read_as_stopped(kf: Kf) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    kf.paths.run.mkdir(parents=True)
    kf.paths.temporal_pidfile.write_text(
        json.dumps(
            {
                "pid": finished.pid,
                "ip": "127.0.0.1",
                "port": 1,
                "ui_port": 2,
                "db_filename": str(kf.paths.temporal_db),
                "started_at": "2024-01-01T00:00:00Z",
            }
        )
    )
    kf.paths.postgres_pidfile.write_text("{not json")
    report = kf.status()
    assert (report["temporal"]["state"], report["postgres"]["state"]) == ("stopped", "stopped")
    notes = "\n".join(report["notes"])
    assert f"pid {finished.pid} (not running)" in notes
    assert "Postgres: removed stale pid file" in notes
    assert not kf.paths.temporal_pidfile.exists() and not kf.paths.postgres_pidfile.exists()
    assert kf.status()["notes"] == []


def test_a_taken_port_is_named_with_the_fix(kf: Kf) -> None:
    port = int(kf.env["KF_TEMPORAL_PORT"])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = kf("up")
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is already in use" in result.stderr
    assert "KF_TEMPORAL_PORT=" in result.stderr
    assert "Traceback" not in result.stderr
    assert not kf.paths.temporal_pidfile.exists()
    assert kf.states() == ("stopped", "stopped")


def test_a_server_that_fails_to_start_shows_its_log(kf: Kf) -> None:
    kf.paths.create()
    kf.paths.temporal_db.write_bytes(b"this is not an SQLite database" * 100)
    result = kf("up")
    assert result.returncode == 2
    assert "Temporal dev server exited during start-up" in result.stderr
    assert f"Last lines of {kf.paths.temporal_log}" in result.stderr
    assert not kf.paths.temporal_pidfile.exists()
    # Postgres started meanwhile; the next `kf up` (after the fix) starts only Temporal.
    assert kf.states() == ("stopped", "running")


def test_a_postgres_that_fails_to_start_shows_its_log(kf: Kf) -> None:
    assert kf("up").returncode == 0
    assert kf("down").returncode == 0
    with (kf.paths.postgres_data / "postgresql.conf").open("a") as config:
        config.write("\nkf_no_such_setting = 1\n")
    result = kf("up")
    assert result.returncode == 2
    assert "Postgres did not start" in result.stderr
    assert "kf_no_such_setting" in result.stderr  # quoted from the server's own log
    assert str(kf.paths.postgres_log) in result.stderr
    assert kf.states() == ("running", "stopped")


async def test_external_servers_are_not_started_but_migrated(
    kf: Kf, fresh_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    kf.env |= {"KF_DATABASE_URL": fresh_db_url, "KF_TEMPORAL_ADDRESS": closed}
    monkeypatch.setenv("KF_DATABASE_URL", fresh_db_url)
    monkeypatch.setenv("KF_TEMPORAL_ADDRESS", closed)

    result = kf("up")
    assert result.returncode == 0, result.stderr
    assert "Temporal: external" in result.stdout and "Postgres: external" in result.stdout
    assert "Migrations: applied" in result.stdout
    assert not kf.paths.temporal_pidfile.exists() and not kf.paths.postgres_data.exists()

    report = kf.status()
    assert kf("status").returncode == 3  # the external Temporal does not answer
    assert report["postgres"] == report["postgres"] | {"state": "external", "reachable": True}
    assert report["temporal"] == report["temporal"] | {"state": "external", "reachable": False}
    assert connections.database_url() == fresh_db_url
    assert connections.temporal_address() == closed
    assert "left alone" in kf("down").stdout


def test_a_port_that_is_not_a_number_is_refused(kf: Kf) -> None:
    kf.env["KF_TEMPORAL_PORT"] = "72x33"
    result = kf("up")
    assert result.returncode == 2
    assert "KF_TEMPORAL_PORT='72x33' is not a TCP port" in result.stderr


def ignore_sigint() -> None:
    """What a shell without job control (a script, CI) does to a command it starts with `&`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_background_worker_stops_on_a_signal_after_the_services_are_down(
    kf: Kf, tmp_path: Path, signum: int, status: int
) -> None:
    # `kf up; kf worker &; … kf down; kill -INT %1`: the worker inherited an ignored SIGINT, and Temporal and
    # Postgres are gone, its pollers retrying against nothing. It stops anyway, with the status of its signal.
    assert kf("up").returncode == 0
    # `kf status` says who would run a search: no worker yet (and the exit status is the servers' alone).
    before = kf("status")
    assert before.returncode == 0, before.stderr
    assert "Workers   none polls kf-control: a search waits for one; start one with `kf worker`" in before.stdout
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [str(KF), "worker"], env=kf.env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=ignore_sigint
        )
    try:
        for _ in range(240):
            if "polling" in log.read_text() or worker.poll() is not None:
                break
            time.sleep(0.5)
        assert "polling" in log.read_text(), log.read_text()
        queues = {queue["task_queue"]: queue for queue in kf.status()["workers"]}
        assert set(queues) >= {"kf-control", "kf-cpu", "kf-build"}, queues
        for name in ("kf-control", "kf-cpu", "kf-build"):
            assert any(identity.endswith(f":{worker.pid}") for identity in queues[name]["pollers"]), queues[name]
        assert queues["kf-control"]["kind"] == "workflow" and queues["kf-build"]["kind"] == "activity"
        # Another prefix's queues are another set of searches': this worker polls none of them.
        other = kf("status", "--prefix", "team-a")
        assert other.returncode == 0, other.stderr
        assert "none polls team-a-control: a search waits for one; start one with `kf worker --prefix team-a`" in (
            other.stdout
        )
        assert kf("down").returncode == 0
        worker.send_signal(signum)
        # A hang guard, not a timing check: before, an ignored SIGINT was never acted on.
        assert worker.wait(timeout=60) == status, log.read_text()[-3000:]
        assert f"{signal.Signals(signum).name}: stopping" in log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
