"""`kf` exits with the status cli/exit_status.py documents, every time, as a real process against real servers.

The installed ``kf`` runs as a subprocess, as a script would run it, against the session's Temporal dev server
and Postgres. The commands that talk to Temporal run REPEATS times each: Temporal's client could crash while
the interpreter shut down (temporalio/sdk-python#300), after the command had printed its result, and replace
its status; `kf` now leaves without that shutdown (cli.entry), and this is the check that it does, every time.
The other commands run FEWER times. Repetitions run BATCH at a time, to fit the test in about a minute and a
half on a two-core machine. Then: bad input exits 2 before any server is contacted; services that do not run
or do not answer, and a machine whose calibration fails, exit 3 with one line on stderr and no traceback; a
reader that closed the pipe (`kf lessons | head`) gets 141 and no traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from search_fixtures import COPY_PROBLEM, QUICK, forget, running_worker, start
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities import search_client
from activities.temporal_client import query_timed_out
from cli import exit_status
from engine.evidence.events import NewEvent
from engine.evidence.store import EventStore
from engine.search.history import stream_of

pytestmark = pytest.mark.slow

KF = Path(sys.executable).with_name("kf")
ROOT = Path(__file__).resolve().parents[1]
REPEATS = 20
"""Runs of each command that talks to Temporal (the shutdown crash was in its client)."""
FEWER = 5
"""Runs of each command that does not."""
BATCH = 5
"""kf processes at once: enough to overlap their start-up, few enough for two cores."""
CRASH_MARKS = ("Traceback", "Fatal Python error", "Exception ignored", "Segmentation fault")
"""What a crash or an unhandled error leaves on stderr."""


@dataclass(frozen=True)
class Done:
    """One finished kf process."""

    argv: tuple[str, ...]
    status: int
    out: str
    err: str


async def kf(argv: Sequence[str], env: Mapping[str, str], *, stdout: int = subprocess.PIPE) -> Done:
    process = await asyncio.create_subprocess_exec(
        str(KF), *argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode is not None
    return Done(tuple(argv), process.returncode, (out or b"").decode(), err.decode())


async def kf_many(runs: Sequence[Sequence[str]], env: Mapping[str, str]) -> list[Done]:
    """Run every argv of ``runs``, BATCH at a time; results in the order given."""
    gate = asyncio.Semaphore(BATCH)

    async def one(argv: Sequence[str]) -> Done:
        async with gate:
            return await kf(argv, env)

    return list(await asyncio.gather(*(one(argv) for argv in runs)))


def assert_status(done: Done, status: int) -> None:
    assert done.status == status, f"kf {' '.join(done.argv)} exited {done.status}, not {status}:\n{done.err[-3000:]}"
    crash = [mark for mark in CRASH_MARKS if mark in done.err]
    assert not crash, f"kf {' '.join(done.argv)}: {crash} on stderr:\n{done.err[-3000:]}"


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (the kernel's pick for port 0, released again)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KF_DATABASE_URL", "KF_DATABASE_OWNER_URL")}
    env.pop("KF_TEMPORAL_ADDRESS", None)
    return env | {"KF_HOME": str(home)}


@pytest.fixture
def services_down(tmp_path: Path) -> dict[str, str]:
    """Temporal and Postgres configured at addresses where nothing answers; no patience for the outage."""
    return base_env(tmp_path / "kf") | {
        "KF_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "KF_DATABASE_URL": f"postgresql://kf@127.0.0.1:{free_port()}/kf",
        "KF_OUTAGE_PATIENCE_S": "0",
    }


@pytest.fixture
def unbuildable_problem() -> Iterator[Path]:
    """softmax with a seed kernel that does not compile: a search of it runs every orchestration step (start,
    target, compile, record, finish) through Temporal, the worker and the event log, then ends on the seed's
    verdict at once -- twenty of them cost seconds, where timing twenty seeds would cost minutes."""
    folder = Path(tempfile.mkdtemp(prefix="kf-unbuildable-"))
    folder.chmod(0o755)  # the compiler's sandbox runs as another user
    try:
        shutil.copytree(
            ROOT / "kernels" / "softmax", folder / "unbuildable", ignore=shutil.ignore_patterns("__pycache__")
        )
        problem = folder / "unbuildable" / "problem.py"
        problem.write_text(problem.read_text().replace('NAME = "softmax"', 'NAME = "unbuildable"'))
        (folder / "unbuildable" / "seed.c").write_text("this is not C\n")
        yield folder / "unbuildable"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def services_env(tmp_path: Path, temporal_env: WorkflowEnvironment, database_url: str) -> dict[str, str]:
    """The environment of a `kf` command on the test's Temporal dev server and database."""
    return base_env(tmp_path / "kf") | {
        "KF_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "KF_DATABASE_URL": database_url,
    }


async def test_every_client_command_exits_with_its_status_every_time(
    temporal_env: WorkflowEnvironment,
    store: EventStore,
    fresh_db_url: str,
    prefix: str,
    tmp_path: Path,
    unbuildable_problem: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = services_env(tmp_path, temporal_env, fresh_db_url)
    # A tiny search: its seed kernel alone (one candidate).
    tiny = ["--prefix", prefix, "--max-candidates", "1"]
    tiny += ["--spec", json.dumps({"heartbeat_seconds": 5, "worker_wait_seconds": 30})]
    start = ["search", "start", str(unbuildable_problem), *tiny, "--wait", "--json"]
    # The worker runs throughout: a query (`kf search show`), even of a finished search, is answered by one.
    async with running_worker(temporal_env.client, store, prefix):
        started = await kf_many([start] * REPEATS, env)
        for done in started:
            assert_status(done, exit_status.OK)
            result = json.loads(done.out)
            assert result["status"] == "budget_exhausted" and result["verdict_counts"] == {"compile_error": 1}
        search_id = json.loads(started[0].out)["search_id"]
        await read_back(env, search_id, started)
        await busy_worker_is_waited_for(temporal_env.client, search_id, monkeypatch)
        # An id that names no search is the input's fault.
        unknown = await kf(["search", "show", "search-that-never-ran"], env)
        assert_status(unknown, exit_status.BAD_INPUT)
        assert "`kf search list` shows the search ids" in unknown.err
    await audit_needs_its_witness_only_when_asked(env, search_id)
    # With no worker left, a finished search is still shown: its progress as it ended is kept in its result.
    orphan = await kf(["search", "show", search_id], env)
    assert_status(orphan, exit_status.OK)
    assert orphan.out.startswith("[budget_exhausted] ") and "1 candidates · compile_error=1 · " in orphan.out
    orphan_json = json.loads((await kf(["search", "show", search_id, "--json"], env)).out)
    assert orphan_json["status"] == "budget_exhausted" and orphan_json["problem"] == str(unbuildable_problem)
    assert orphan_json["verdict_counts"] == {"compile_error": 1} and orphan_json["step"] == ""
    followed = await kf(["search", "show", search_id, "--wait"], env)
    assert_status(followed, exit_status.OK)
    assert f"search {search_id}: budget_exhausted" in followed.out and "waiting for a worker" not in followed.err
    # A search whose queue no worker ever polled: Temporal holds its query until the deadline, unanswered.
    unserved = await kf(["search", "start", str(unbuildable_problem), "--prefix", f"{prefix}-unserved", "--json"], env)
    assert_status(unserved, exit_status.OK)
    waited = await kf(["search", "show", json.loads(unserved.out)["search_id"]], env)
    assert_status(waited, exit_status.MACHINE)
    assert waited.err.startswith("kf: error: no worker answers for this search") and waited.err.count("\n") == 1


async def audit_needs_its_witness_only_when_asked(env: dict[str, str], search_id: str) -> None:
    """With Temporal unreachable, `kf audit` still checks the chain, says the witness is unavailable and exits 0;
    with --require-witness it exits 3, naming why and what to start. With Temporal up, both exit 0."""
    witnessed = await kf(["audit", search_id, "--require-witness", "--json"], env)
    assert_status(witnessed, exit_status.OK)
    assert json.loads(witnessed.out)["witness"]["status"] == "intact"
    no_temporal = env | {"KF_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}", "KF_OUTAGE_PATIENCE_S": "0"}
    lenient = await kf(["audit", search_id], no_temporal)
    assert_status(lenient, exit_status.OK)
    assert "hash chain: intact" in lenient.out and "witness: UNAVAILABLE" in lenient.out
    strict = await kf(["audit", search_id, "--require-witness", "--json"], no_temporal)
    assert_status(strict, exit_status.MACHINE)
    unread = json.loads(strict.out)["witness"]  # the report is printed all the same
    assert unread["status"] == "unavailable" and unread["transient"] is True  # Temporal did not answer: ask again
    assert strict.err.startswith("kf: error: the witness could not be checked") and "kf up" in strict.err


async def busy_worker_is_waited_for(client: Client, search_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query whose first deadline passes while a worker polls the search's queue waits again for that worker: on
    a loaded machine a closed search's query (a replay of its history) can take longer than the first deadline,
    and the search is then shown, not said to have no worker."""
    handle = client.get_workflow_handle(search_id)
    await handle.query("status")  # the worker answers, and polls again at once
    instant = timedelta(milliseconds=1)
    with pytest.raises(Exception) as missed:
        await handle.query("status", rpc_timeout=instant)
    assert query_timed_out(missed.value), repr(missed.value)  # no worker answers within a millisecond
    monkeypatch.setattr(search_client, "STATUS_QUERY_TIMEOUT", instant)
    # The query itself: a finished search's `kf search show` reads its result instead (no worker needed).
    status = await search_client.queried_status(client, search_id)
    assert status.search_id == search_id and status.verdict_counts == {"compile_error": 1}


async def read_back(env: dict[str, str], search_id: str, started: list[Done]) -> None:
    """The commands that read what the searches left, each run many times, then with no reader for its output."""
    runs = {
        ("search", "list", "--json"): (REPEATS, exit_status.OK),
        ("search", "show", search_id, "--json"): (REPEATS, exit_status.OK),
        ("audit", search_id, "--json"): (REPEATS, exit_status.OK),  # the witness is read from Temporal
        ("lessons", "--json"): (FEWER, exit_status.OK),
        ("db", "status", "--json"): (FEWER, exit_status.OK),
        ("status", "--json"): (FEWER, exit_status.OK),  # both servers external, and answering
    }
    argvs = [list(argv) for argv, (times, _) in runs.items() for _ in range(times)]
    for done in await kf_many(argvs, env):
        assert_status(done, runs[done.argv][1])
        json.loads(done.out)  # the whole JSON document, not cut short
    listed = json.loads((await kf(["search", "list", "--json"], env)).out)
    assert {row["search_id"] for row in listed} >= {json.loads(d.out)["search_id"] for d in started}

    # `kf lessons | head` when head has gone before the output arrives: 141, as for any command SIGPIPE kills.
    for argv in (["lessons"], ["search", "list"], ["search", "show", search_id]):
        reader, writer = os.pipe()
        os.close(reader)
        try:
            done = await kf(argv, env, stdout=writer)
        finally:
            os.close(writer)
        assert_status(done, exit_status.OUTPUT_CLOSED)


BAD_INPUT = [
    ["search", "start", "softmax", "--generations", "0"],
    ["search", "start", "no_such_problem"],
    ["search", "show", "bad\nid"],
    ["search", "list", "--limit", "0"],
    ["lessons", "--target", "gpu"],
    ["audit"],
    ["audit", "--all", "--require-witness"],
    ["evaluate", "--problem", "no_such_problem", "--source", "k.c"],
    ["db", "status", "--database-url", "mysql://db/kf"],
    ["worker", "--metrics-port", "0"],
    ["worker", "--prefix", ""],
    ["worker", "--prefix", "team/a"],
    ["worker", "--identity", " "],
    ["status", "--prefix", "team a"],
    # A GPU asked for by a UUID no GPU has: a worker for the CPU alone would leave that GPU's searches waiting.
    ["worker", "--gpu", "GPU-00000000-0000-0000-0000-000000000000"],
    ["no-such-command"],
]


async def test_bad_input_exits_2_before_any_server_is_contacted(services_down: dict[str, str]) -> None:
    # The servers are down: a command that contacted one would exit 3, not 2.
    for done in await kf_many(BAD_INPUT, services_down):
        assert_status(done, exit_status.BAD_INPUT)


SERVICE_COMMANDS = [
    ["search", "list"],
    ["search", "show", "search-softmax-0"],
    ["search", "show", "search-softmax-0", "--wait", "--json"],
    ["search", "start", "softmax"],
    ["search", "pause", "search-softmax-0"],
    ["audit", "search-softmax-0"],
    ["audit", "--all"],
    ["lessons"],
    ["db", "status"],
    ["db", "migrate"],
    ["search", "start", "softmax", "--resume-from", "search-softmax-0"],  # only Postgres knows the id
]


async def test_services_that_do_not_answer_exit_3_in_one_line(services_down: dict[str, str], tmp_path: Path) -> None:
    # Configured servers that do not answer, then the embedded ones of a state folder where `kf up` never ran.
    not_started = base_env(tmp_path / "never-up")
    cases = [(services_down, SERVICE_COMMANDS, "cannot "), (not_started, SERVICE_COMMANDS[::3], "run `kf up` first")]
    for env, argvs, says in cases:
        for done in await kf_many(argvs, env):
            assert_status(done, exit_status.MACHINE)
            last = done.err.strip().splitlines()[-1]
            assert last.startswith("kf: error: ") and says in last, done.err
            assert done.err.strip().count("kf: error:") == 1, done.err


async def test_resume_from_a_search_the_log_does_not_hold_exits_2_before_anything_starts(
    services_down: dict[str, str], fresh_db_url: str, store: EventStore
) -> None:
    # Postgres answers, Temporal does not: a command that went on to start the search would exit 3.
    env = services_down | {"KF_DATABASE_URL": fresh_db_url}
    started = NewEvent(event_id="search-earlier/started", type="search.started", payload={"spec": {}})
    await store.append(stream_of("search-earlier"), [started])
    unknown, in_spec, known = await kf_many(
        [
            ["search", "start", "softmax", "--resume-from", "search-nowhere"],
            ["search", "start", "softmax", "--spec", '{"resume_from": "search-nowhere"}'],
            ["search", "start", "softmax", "--resume-from", "search-earlier"],
        ],
        env,
    )
    for done, option in ((unknown, "--resume-from"), (in_spec, "--spec field resume_from")):
        assert_status(done, exit_status.BAD_INPUT)
        assert done.err.strip() == (
            f"kf: error: {option} 'search-nowhere': the event log holds no search of that id to resume from; "
            "`kf search list` shows the search ids"
        ), done.err
    assert_status(known, exit_status.MACHINE)  # the log holds it: on to Temporal, which does not answer
    assert "Temporal" in known.err, known.err


async def test_a_search_that_ended_before_its_first_event_is_said_to_exist(
    temporal_env: WorkflowEnvironment, store: EventStore, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    # Started from the Web UI with a bad input, the search fails at once: Temporal has it, the log has nothing.
    env = services_env(tmp_path, temporal_env, fresh_db_url)
    async with running_worker(temporal_env.client, store, prefix):
        handle = await start(temporal_env.client, prefix, {"problem": "softmax", "generations": 0})
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    said = (
        f"kf: error: search {handle.id!r} exists in Temporal but recorded no events: it ended before its first step "
        "(failed: invalid search input: generations"
    )
    for done in await kf_many([[command, handle.id] for command in ("audit", "report", "export")], env):
        assert_status(done, exit_status.BAD_INPUT)
        assert done.err.startswith(said), done.err
    # An id neither holds: the log's answer stands.
    nowhere = await kf(["audit", "search-nowhere"], env)
    assert_status(nowhere, exit_status.BAD_INPUT)
    assert nowhere.err.strip() == (
        "kf: error: no events for search 'search-nowhere'; `kf search list` shows the search ids"
    ), nowhere.err


async def test_a_machine_calibration_that_fails_exits_3_in_one_line(tmp_path: Path) -> None:
    source = ROOT / "kernels" / "softmax" / "seed.c"
    # The real `kf` entry point in a real process, on a machine whose calibration fails (as when its sandboxed
    # worker gives no answer): measured figures are looked for in an empty folder, and the measurement fails.
    script = textwrap.dedent(
        f"""
        import sys
        import engine.harness.machine as machine

        def no_result(*args, **kwargs):
            raise machine.CalibrationFailed("machine calibration failed: no result")

        machine._calibrate = no_result
        sys.argv = ["kf", "evaluate", "--problem", "softmax", "--source", {str(source)!r}, "--budget", "0.2"]
        from cli import entry
        entry()
        """
    )
    env = base_env(tmp_path / "kf") | {"KF_MACHINE_DIR": str(tmp_path / "machine")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=240)
    done = Done(("evaluate",), process.returncode or 0, out.decode(), err.decode())
    assert_status(done, exit_status.MACHINE)
    assert done.err.strip().splitlines()[-1] == (
        "kf evaluate: the machine failed, not the kernel: machine calibration failed: no result"
    ), done.err
    assert done.out == ""


@pytest.mark.parametrize(
    ("signum", "status", "said"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
async def test_a_follower_stopped_says_the_search_goes_on(
    services_down: dict[str, str], signum: int, status: int, said: str
) -> None:
    # Temporal is unreachable and the follower waits it out; stopped meanwhile, it says what became of the search.
    # The stop lands at several moments of the wait (asleep, connecting, between the two): it ends the follower
    # wherever it lands, even where the code or a library in between would swallow an exception raised there.
    env = services_down | {"KF_OUTAGE_PATIENCE_S": "600"}
    for after_s in (0.0, 0.2, 0.45, 0.6, 1.1):
        process = await asyncio.create_subprocess_exec(
            str(KF),
            "search",
            "show",
            "search-softmax-0",
            "--wait",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stderr is not None
        first = await asyncio.wait_for(process.stderr.readline(), timeout=60)
        assert first.startswith(b"Temporal unreachable, retrying"), first
        await asyncio.sleep(after_s)
        process.send_signal(signum)
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout=30)
        except TimeoutError:
            process.kill()
            rest = await process.stderr.read()
            raise AssertionError(f"stopped {after_s} s into the wait, the follower went on: {rest[-2000:]!r}") from None
        assert process.returncode == status, (after_s, err)
        last = err.decode().strip().splitlines()[-1]
        assert last == (
            f"kf: {said}; search search-softmax-0 goes on without this follower: "
            "`kf search show search-softmax-0 --wait` follows it again"
        ), (after_s, err)
        assert not out


async def test_a_terminated_search_is_shown_from_its_event_log_once_no_worker_answers(
    temporal_env: WorkflowEnvironment, store: EventStore, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    env = services_env(tmp_path, temporal_env, fresh_db_url)
    client = temporal_env.client
    spec = {"problem": COPY_PROBLEM, "generations": 50, "candidates_per_generation": 2, "seed": 3, **QUICK}
    async with running_worker(client, store, prefix):
        handle = await start(client, prefix, spec)
        for _ in range(600):  # until two candidates are judged
            if (await search_client.queried_status(client, handle.id)).candidates_done >= 2:
                break
            await asyncio.sleep(0.2)
        await search_client.send_update(client, handle.id, "add_hint", "try the widest vectors")
        await search_client.send_update(client, handle.id, "pause")
        for _ in range(600):  # paused with nothing under way: the workflow's state and the log agree
            asked = await search_client.queried_status(client, handle.id)
            if asked.status == "paused" and not asked.step:
                break
            await asyncio.sleep(0.2)
        await handle.terminate(reason="stopped by the test")
    # No worker now: the query cannot be answered, the log tells the search instead (exit 1: it did not complete).
    shown, said = await kf_many([["search", "show", handle.id, "--json"], ["search", "show", handle.id]], env)
    assert_status(shown, exit_status.FAILED)
    logged = json.loads(shown.out)
    assert logged["status"] == "terminated" and logged["from_log"] is True
    assert asked.candidates_done >= 2 and asked.best_speedup is not None
    assert asked.hints == ["try the widest vectors"]
    shared = ("candidates_done", "verdict_counts", "harness_errors", "best_speedup", "incumbent_id", "timings")
    for field in (*shared, "llm_spend_usd", "hints", "max_candidates"):
        assert logged[field] == getattr(asked, field), (field, logged[field], getattr(asked, field))
    assert logged["problem"] == COPY_PROBLEM and logged["generations"] == 50
    assert_status(said, exit_status.FAILED)
    assert said.out.startswith("[terminated] ") and "(from the event log: no worker answers" in said.out
    assert said.err == f"kf: search {handle.id} terminated: stopped by the test\n", said.err

    # Temporal forgets it (as its retention does, a day on the dev server): the log alone tells it, with no end
    # recorded (terminated), so exit 1 saying so; followed with --wait, the same; an id neither knows is bad input.
    await forget(client, handle.id)
    shown, said, followed, unknown, listed = await kf_many(
        [
            ["search", "show", handle.id, "--json"],
            ["search", "show", handle.id],
            ["search", "show", handle.id, "--wait"],
            ["search", "show", f"{handle.id}-never"],
            ["search", "list", "--json"],
        ],
        env,
    )
    # `kf search list` lists it too, from the log: Temporal's list no longer has it.
    assert_status(listed, exit_status.OK)
    row = next(r for r in json.loads(listed.out) if r["search_id"] == handle.id)
    assert row["from_log"] is True and row["status"] == "unknown" and row["problem"] == COPY_PROBLEM, row
    for done in (shown, said, followed):
        assert_status(done, exit_status.FAILED)
    forgotten = json.loads(shown.out)
    assert forgotten["status"] == "unknown" and forgotten["from_log"] is True
    for field in shared:
        assert forgotten[field] == logged[field], (field, forgotten[field], logged[field])
    assert said.out.startswith("[unknown] ") and "Temporal holds no search of that id" in said.out
    assert "UI:" not in said.out and "has no end in its event log" in said.err
    assert followed.out == said.out and followed.err == said.err
    assert_status(unknown, exit_status.BAD_INPUT)
