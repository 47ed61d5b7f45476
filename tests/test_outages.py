"""Infrastructure failures are told apart from kernel outcomes, waited out, and never counted as verdicts.

- which errors are outages (a database or Temporal that is unreachable) and which are not;
- ``wait_out`` retries outages until the operation succeeds, and gives up loudly after the patience;
- a sandboxed worker killed from outside is ``harness_error``, never the kernel's ``crash``; the activity runs
  such a judgement again in a fresh sandbox before concluding anything;
- a search whose candidates the infrastructure failed to judge reports them as harness errors everywhere
  (result, status, generation.completed, search.finished, history, audit, CLI), never as a verdict;
- an older log's outcome that was an infrastructure failure (a crash from SIGKILL) is neither counted by the
  lessons projection nor reused as evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import psutil
import pytest
from lessons_fixtures import TARGET, SyntheticSearch
from search_fixtures import QUICK, start
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities import search_client
from activities.search import SearchActivities
from activities.temporal_client import no_poller, query_timed_out, unreachable
from cli import exit_status
from cli.exit_status import classify
from cli.search import format_result
from engine.errors import ConfigurationError, InfrastructureError
from engine.evidence.events import NewEvent
from engine.evidence.index import recorded_evidence
from engine.evidence.lessons_projection import catch_up_lessons
from engine.evidence.store import EventStore
from engine.hardware import cpu_target
from engine.harness.cpu import DEFAULT_FLAGS, compile_source
from engine.harness.sandbox import HARNESS_WORKER
from engine.harness.validation import validate_artifact
from engine.harness.verdicts import ValidationReport, Verdict
from engine.outages import is_kernel_outcome, is_outage, is_shortage, wait_out
from engine.problems import load_problem
from engine.search.audit import audit_search
from engine.search.candidates import Candidate
from engine.search.history import load_search_history, stream_of
from engine.search.spec import control_queue, target_queue
from engine.search.state import SearchState
from engine.search.steps import StepInput, StepOutput
from workflows.kernel_search import KernelSearch

# -- which errors are outages ----------------------------------------------------------------------------------


async def test_a_stopped_postgres_is_an_outage_and_bad_sql_is_not(store: EventStore) -> None:
    missing = Path(tempfile.mkdtemp(prefix="kf-no-pg-"))  # a folder without Postgres's socket in it
    with pytest.raises(OSError) as refused:
        await asyncpg.connect(host=str(missing), port=5432, user="postgres", database="postgres")
    assert is_outage(refused.value)  # FileNotFoundError, raised by the driver: the server is gone
    with pytest.raises(ConfigurationError) as wrapped:
        await EventStore.connect(f"postgresql://postgres@/postgres?host={missing}&port=5432")
    assert is_outage(wrapped.value)  # the clear message wraps the outage
    with pytest.raises(asyncpg.PostgresError) as bad_sql:
        await store.pool.fetchval("SELECT no_such_column FROM events")
    assert not is_outage(bad_sql.value)


async def test_a_database_short_of_disk_is_waited_out_and_loses_nothing(store: EventStore) -> None:
    # Postgres fails the next two inserts into the log with disk_full, as it does when it cannot extend a table's
    # file (a trigger raises the server's own SQLSTATE; a sequence counts, as it is not rolled back with them).
    await store.pool.execute(
        """
        CREATE SEQUENCE kf_disk_full_left;
        CREATE FUNCTION kf_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('kf_disk_full_left') <= 2 THEN
                RAISE EXCEPTION 'could not extend file "base/1/2": No space left on device'
                    USING ERRCODE = 'disk_full';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER kf_disk_full BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION kf_disk_full();
        """
    )
    event = NewEvent(event_id="search-full/started", type="search.started", payload={"problem": "softmax"})
    with pytest.raises(asyncpg.exceptions.DiskFullError) as full:
        await store.append("search-full", [event])
    assert is_outage(full.value) and is_shortage(full.value)
    status, line = classify(full.value) or (None, "")
    assert status == exit_status.MACHINE and line.startswith("Postgres ran short of disk"), line
    said: list[str] = []
    recorded = await wait_out(lambda: store.append("search-full", [event]), what="Postgres", say=said.append)
    assert [e.event_id for e in recorded] == [event.event_id] and len(said) == 1 and "DiskFullError" in said[0]
    assert [e.event_id for e in await store.read_stream("search-full")] == [event.event_id]
    # Past the patience it is the machine's failure, and the fix named is to free space, not to restart.
    await store.pool.execute("ALTER SEQUENCE kf_disk_full_left RESTART")
    with pytest.raises(InfrastructureError) as gave_up:
        await wait_out(
            lambda: store.append("search-full", [event.model_copy(update={"event_id": "search-full/other"})]),
            what="Postgres",
            patience_s=0.2,
            say=said.append,
        )
    assert "free disk space, memory or connections where it runs" in str(gave_up.value)
    with pytest.raises(asyncpg.PostgresError) as bad_sql:
        await store.pool.fetchval("SELECT no_such_column FROM events")
    assert not is_shortage(bad_sql.value)


async def test_a_database_that_refuses_writes_for_a_while_is_waited_out(store: EventStore, fresh_db_url: str) -> None:
    # Made read-only for maintenance, as an operator does: every new session of the database defaults to read-only
    # (the store's sessions are made to start again, as a failover to a standby would make them).
    event = NewEvent(event_id="search-read-only/started", type="search.started", payload={"problem": "softmax"})
    database = await store.pool.fetchval("SELECT current_database()")
    admin = await asyncpg.connect(fresh_db_url)
    try:
        await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        await store.pool.expire_connections()  # the store's sessions start again, under the database's default
        with pytest.raises(asyncpg.exceptions.ReadOnlySQLTransactionError) as refused:
            await store.append("search-read-only", [event])
        assert is_outage(refused.value) and not is_shortage(refused.value)
        status, line = classify(refused.value) or (None, "")
        assert status == exit_status.MACHINE and line.startswith("Postgres refused to write: it is read-only"), line
        said: list[str] = []

        async def writable_again() -> None:
            while not said:
                await asyncio.sleep(0.05)
            await admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            await store.pool.expire_connections()

        recorded, _ = await asyncio.gather(
            wait_out(lambda: store.append("search-read-only", [event]), what="Postgres", say=said.append),
            writable_again(),
        )
        assert [e.event_id for e in recorded] == [event.event_id] and "ReadOnlySQLTransactionError" in said[0]
        assert [e.event_id for e in await store.read_stream("search-read-only")] == [event.event_id]
        # Past the patience the fix named is to make it writable, not to restart it.
        await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        await store.pool.expire_connections()
        with pytest.raises(InfrastructureError) as gave_up:
            other = event.model_copy(update={"event_id": "search-read-only/other"})
            await wait_out(lambda: store.append("search-read-only", [other]), what="Postgres", patience_s=0.2)
        assert "make it writable" in str(gave_up.value)
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
        await admin.close()


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (ConnectionRefusedError(111, "Connection refused"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"), True),
        (asyncpg.exceptions.CannotConnectNowError("the database system is starting up"), True),
        (asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"), True),
        (asyncpg.exceptions.QueryCanceledError("canceling statement due to user request"), True),
        (FileNotFoundError(2, "No such file or directory"), False),  # not raised by the driver: a bug
        (asyncpg.exceptions.UniqueViolationError("duplicate key"), False),
        (ValueError("a kernel's bad value"), False),
        (InfrastructureError("Postgres stayed unreachable"), False),  # already waited out: never twice
    ],
)
def test_outage_classification(error: Exception, outage: bool) -> None:
    assert is_outage(error) is outage


def test_an_unreachable_temporal_is_told_from_an_answer() -> None:
    assert unreachable(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""))
    assert unreachable(RPCError("transport error", RPCStatusCode.UNKNOWN, b""))
    # The broken HTTP/2 connection `kf search show` met once on CI's machine (it exited 1 with a traceback).
    assert unreachable(RPCError("h2 protocol error: http2 error", RPCStatusCode.CANCELLED, b""))
    assert not unreachable(RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b""))
    # Refused for load (a rate limit): the SDK retries such calls itself, slowing them to the limit (measured on
    # the dev server at frontend.namespaceRPS=2: 30 calls took 16 s, none failed); one that still fails is
    # waited out and said as load, exit 3, never a traceback.
    limited = RPCError("namespace rate limit exceeded", RPCStatusCode.RESOURCE_EXHAUSTED, b"")
    assert unreachable(limited)
    status, message = classify(limited) or (None, "")
    assert status == 3 and "for load" in message and "frontend.namespaceRPS" in message, message
    connect_failed = RuntimeError("Failed client connect: Server connection error: tonic::transport::Error(...)")
    try:
        raise ConfigurationError("cannot reach Temporal") from connect_failed
    except ConfigurationError as wrapped:
        assert unreachable(wrapped)
    # An outage already waited out past its patience is reported, not waited out again, whatever it wraps.
    try:
        raise InfrastructureError("Temporal unreachable for 300 s") from ConnectionRefusedError(111, "refused")
    except InfrastructureError as given_up:
        assert not unreachable(given_up) and not is_outage(given_up)


def test_a_query_no_worker_answered_is_said_as_no_worker_whichever_side_timed_it_out() -> None:
    client_deadline = RPCError("Timeout expired", RPCStatusCode.CANCELLED, b"")
    server_deadline = RPCError("query timed out before a worker could process it", RPCStatusCode.DEADLINE_EXCEEDED, b"")
    gone = RPCError(
        "no poller seen for task queue recently, worker may be down", RPCStatusCode.FAILED_PRECONDITION, b""
    )
    assert query_timed_out(client_deadline) and query_timed_out(server_deadline) and not query_timed_out(gone)
    assert no_poller(gone) and not no_poller(server_deadline)
    # The server's deadline carries DEADLINE_EXCEEDED, as an unreachable frontend does: it still reads as a
    # worker that did not answer, exit 3 with the fix (`kf worker`), not as Temporal being down.
    for error in (client_deadline, server_deadline, gone):
        status, line = classify(error) or (None, "")
        assert status == exit_status.MACHINE and line.startswith("no worker answers for this search"), line


class _BrokenAtTheDeadline:
    """A workflow handle whose query breaks its connection after ``after`` seconds, as the Temporal client's
    HTTP/2 stream did on CI when a query with no worker reached its deadline (the client is outside the project:
    the break cannot be made to happen on demand)."""

    def __init__(self, after: float) -> None:
        self.after = after

    def get_workflow_handle(self, search_id: str) -> _BrokenAtTheDeadline:
        return self

    async def query(self, *args: object, **kwargs: object) -> None:
        await asyncio.sleep(self.after)
        raise RPCError("h2 protocol error: http2 error", RPCStatusCode.CANCELLED, b"")

    async def describe(self) -> None:
        raise RPCError("h2 protocol error: http2 error", RPCStatusCode.CANCELLED, b"")


async def test_a_connection_that_breaks_at_the_query_deadline_is_no_worker_and_at_once_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(search_client, "STATUS_QUERY_TIMEOUT", timedelta(seconds=0.2))
    with pytest.raises(RPCError) as at_deadline:
        await search_client.queried_status(_BrokenAtTheDeadline(0.25), "search-x")  # type: ignore[arg-type]
    status, line = classify(at_deadline.value) or (None, "")
    assert status == exit_status.MACHINE and line.startswith("no worker answers for this search"), line
    with pytest.raises(RPCError) as at_once:
        await search_client.queried_status(_BrokenAtTheDeadline(0.0), "search-x")  # type: ignore[arg-type]
    status, line = classify(at_once.value) or (None, "")
    assert status == exit_status.MACHINE and line.startswith("Temporal stopped answering"), line


def test_only_kernel_caused_outcomes_are_verdicts() -> None:
    assert is_kernel_outcome("crash", signal.SIGSEGV)
    assert is_kernel_outcome("crash", signal.SIGABRT)
    assert is_kernel_outcome("crash", None)  # exited during a call: the kernel's
    assert is_kernel_outcome("incorrect")
    assert not is_kernel_outcome("crash", signal.SIGKILL)  # the OOM killer or an operator
    assert not is_kernel_outcome("crash", signal.SIGTERM)
    assert not is_kernel_outcome("harness_error")


# -- waiting out -----------------------------------------------------------------------------------------------


async def test_wait_out_retries_an_outage_until_the_server_answers() -> None:
    calls: list[int] = []
    ticks: list[int] = []
    said: list[str] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError(111, "Connection refused")
        return "answered"

    got = await wait_out(flaky, what="Postgres", patience_s=60, on_wait=lambda: ticks.append(1), say=said.append)
    assert got == "answered" and len(calls) == 3
    assert ticks, "the caller heartbeats while it waits"
    assert len(said) == 2 and all(line.startswith("Postgres unreachable, retrying") for line in said)


async def test_wait_out_gives_up_loudly_after_the_patience_and_never_hides_other_errors() -> None:
    async def down() -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(InfrastructureError, match=r"Postgres stayed unreachable.*KF_OUTAGE_PATIENCE_S"):
        await wait_out(down, what="Postgres", patience_s=0, say=lambda _: None)

    async def wrong() -> None:
        raise ValueError("not an outage")

    with pytest.raises(ValueError):
        await wait_out(wrong, what="Postgres", patience_s=60)


def test_the_patience_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.config import outage_patience_s

    monkeypatch.delenv("KF_OUTAGE_PATIENCE_S", raising=False)
    assert outage_patience_s() == 600
    monkeypatch.setenv("KF_OUTAGE_PATIENCE_S", "90")
    assert outage_patience_s() == 90
    monkeypatch.setenv("KF_OUTAGE_PATIENCE_S", "soon")
    with pytest.raises(ConfigurationError, match="KF_OUTAGE_PATIENCE_S='soon'"):
        outage_patience_s()


# -- a sandbox killed from outside -------------------------------------------------------------------------------

SPINNER = """
#include <stdint.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    volatile int64_t spin = 0;
    (void)x; (void)y; (void)rows; (void)cols;
    for (;;) spin++;
}
"""


def _sandboxed(process: str) -> list[psutil.Process]:
    """This process's sandboxed harness workers (``worker``) or the sandbox inits above them (``init``)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = child.cmdline()
            # [python, -I, worker.py, ...]; the init's command line names the worker too, after "--".
            is_worker = argv[2:3] == [str(HARNESS_WORKER)]
            if is_worker == (process == "worker") and str(HARNESS_WORKER) in argv:
                found.append(child)
    return found


@pytest.mark.parametrize(
    ("victim", "signum"), [("worker", signal.SIGKILL), ("worker", signal.SIGTERM), ("init", signal.SIGKILL)]
)
def test_a_sandbox_killed_from_outside_is_a_harness_error_not_a_crash(tmp_path: Path, victim: str, signum: int) -> None:
    problem = load_problem("softmax")
    compiled = compile_source(problem, SPINNER, DEFAULT_FLAGS, cache_dir=tmp_path)
    assert compiled.artifact_id is not None, compiled.first_error
    reports: list[ValidationReport] = []
    judge = threading.Thread(
        target=lambda: reports.append(
            validate_artifact(problem, compiled.artifact_id or "", seeds=1, cache_dir=tmp_path, call_timeout_s=60)
        )
    )
    judge.start()
    deadline = time.monotonic() + 120
    while not _sandboxed("worker"):
        assert judge.is_alive() and time.monotonic() < deadline, "the sandboxed worker never started"
        time.sleep(0.05)
    time.sleep(0.5)  # inside the spinning call by now
    for process in _sandboxed(victim):  # the operator's (or the OOM killer's) victim
        process.send_signal(signum)
    judge.join(timeout=120)
    (report,) = reports
    assert report.verdict == Verdict.harness_error, report.model_dump_json(indent=1)


async def test_a_harness_failure_is_judged_again_in_a_fresh_sandbox_before_anything_is_concluded(
    store: EventStore,
) -> None:
    acts = SearchActivities(store)
    runs: list[int] = []

    def killed_then_judged() -> ValidationReport:
        runs.append(1)
        if len(runs) == 1:
            return ValidationReport(verdict=Verdict.harness_error, message="killed by SIGKILL from outside")
        return ValidationReport(verdict=Verdict.incorrect, message="y[0] off")

    report, _ = await acts._judging(killed_then_judged)
    assert report.verdict == Verdict.incorrect and len(runs) == 2

    def always_killed() -> ValidationReport:
        return ValidationReport(verdict=Verdict.harness_error, message="killed by SIGKILL from outside")

    with pytest.raises(ApplicationError) as failed:
        await acts._judging(always_killed)
    assert failed.value.type == "HarnessError" and not failed.value.non_retryable


# -- summaries never count an infrastructure failure ------------------------------------------------------------------


@activity.defn(name="kf.validate")
async def validate_while_postgres_is_gone(step: StepInput) -> StepOutput:
    """Stands in for kf.validate after it waited out its patience for a database that never came back."""
    raise ApplicationError(
        "the event store (Postgres) stayed unreachable for 600 s", type="InfrastructureError", non_retryable=True
    )


@contextlib.asynccontextmanager
async def worker_without_a_database_for_validation(
    client: Client, store: EventStore, prefix: str
) -> AsyncIterator[None]:
    acts = SearchActivities(store, identity=f"test-worker-{prefix}")
    target = cpu_target()
    workers = [
        Worker(
            client,
            task_queue=control_queue(prefix),
            workflows=[KernelSearch],
            activities=[acts.start_search, acts.propose, acts.record],
        ),
        Worker(client, task_queue=target_queue(prefix, "cpu"), activities=[acts.describe_worker]),
        Worker(
            client,
            task_queue=target_queue(prefix, target),
            activities=[acts.describe_worker, acts.compile, validate_while_postgres_is_gone, acts.benchmark],
        ),
    ]
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


@pytest.mark.slow
async def test_candidates_the_infrastructure_failed_are_reported_as_such_never_as_ok(
    client: Client, store: EventStore, prefix: str
) -> None:
    async with worker_without_a_database_for_validation(client, store, prefix):
        handle = await start(
            client,
            prefix,
            {"problem": "softmax", "generations": 1, "candidates_per_generation": 2, "proposer": {"kind": "random"}}
            | QUICK,
        )
        result = await asyncio.wait_for(handle.result(), timeout=300)

    # Every candidate compiled (ok), then its validation failed for want of a database: none was judged.
    assert result.status == "completed"
    assert result.harness_errors == 3 and result.candidates_done == 0
    assert result.verdict_counts == {}, "a compile's ok is no verdict on the kernel"
    assert result.best_speedup is None
    summary = format_result(result, as_json=False)
    assert "(ok" not in summary and "not judged: 3 (harness_error" in summary

    events = await store.read_stream(stream_of(handle.id))
    completed = [e for e in events if e.type == "generation.completed"]
    assert {o["verdict"] for e in completed for o in e.payload["outcomes"]} == {"harness_error"}
    finished = next(e for e in events if e.type == "search.finished")
    assert finished.payload["verdict_counts"] == {} and finished.payload["harness_errors"] == 3
    failures = [e for e in events if e.type == "candidate.harness_error"]
    assert len(failures) == 3
    assert {(e.payload["step"], e.payload["error_type"]) for e in failures} == {("validate", "InfrastructureError")}

    history = await load_search_history(store, handle.id)
    assert {c.verdict for c in history.candidates.values()} == {"harness_error"}
    assert history.verdict_counts == {} and len(history.harness_errors) == 3
    report = await audit_search(store._database_url, handle.id)
    assert report["verdict_counts"] == {} and report["harness_errors"] == 3
    assert {c["verdict"] for c in report["candidates"]} == {"harness_error"}
    assert report["chain"]["intact"]


def test_the_state_counts_judged_candidates_only() -> None:
    state = SearchState.model_validate(
        {
            "search_id": "s",
            "spec": {"problem": "softmax"},
            "evaluated": ["a", "b", "c"],
            "verdict_counts": {"ok": 2},
            "harness_errors": ["c"],
        }
    )
    assert state.candidates_done == 2


# -- older logs: an infrastructure failure recorded as a verdict is neither counted nor reused ------------------------


async def test_a_crash_from_sigkill_in_an_older_log_is_neither_counted_nor_reused(store: EventStore) -> None:
    problem = load_problem("softmax")
    seed = Candidate.create(problem.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    earlier = SyntheticSearch(store, "search-older", "softmax")
    events = earlier.start(seed)
    compiled, *_ = earlier.outcome(0, seed, failure="incorrect", speedup=None, parent_speedup=None)
    killed = earlier.event(
        "search-older/g0/validated",
        "candidate.validated",
        {
            "generation": 0,
            "candidate_id": seed.candidate_id,
            "output": StepOutput(step="validate", verdict="crash", event_id="search-older/g0/validated").model_dump(
                mode="json"
            ),
            # What the harness recorded before it told a SIGKILL from outside from a crash of the kernel's.
            "evidence": {"verdict": "crash", "signal": int(signal.SIGKILL), "message": "crashed with SIGKILL"},
        },
    )
    await store.append(earlier.stream, [*events, compiled, killed])
    later = SyntheticSearch(store, "search-later", "softmax")
    await store.append(later.stream, later.start(seed))

    evidence = await recorded_evidence(store, "search-later", seed.candidate_id)
    assert evidence is not None and evidence.target == TARGET
    assert evidence.compile_verdict == "ok", "the compile was the kernel's outcome: reusable"
    assert evidence.validation_verdict is None, "the SIGKILL was not: judged afresh"
    await catch_up_lessons(store)
    validated = await store.pool.fetchval(
        "SELECT validated FROM lesson_stats WHERE problem = 'softmax' AND target = $1 AND change = '*'", TARGET
    )
    assert validated == 0
    history = await load_search_history(store, "search-older")
    assert history.candidates[seed.candidate_id].verdict == "harness_error"
    assert history.verdict_counts == {}


def test_an_untimed_gpu_library_baseline_is_not_a_harness_failure() -> None:
    """A GPU worker without CuPy cannot time the library baseline; retrying elsewhere would not help, so that
    report alone does not fail the step, while any other reference's harness_error still does."""
    from activities.search import _harness_failure
    from engine.harness.verdicts import BenchmarkReport, Verdict

    def report(reference: str, verdict: Verdict) -> BenchmarkReport:
        return BenchmarkReport.model_construct(verdict=verdict, reference=reference, message=f"{reference} {verdict}")

    untimed = [report("incumbent", Verdict.ok), report("cupy", Verdict.harness_error)]
    assert _harness_failure(untimed, optional=("cupy",)) is None
    assert _harness_failure(untimed) == "cupy harness_error"
    broken = [report("incumbent", Verdict.harness_error), report("cupy", Verdict.ok)]
    assert _harness_failure(broken, optional=("cupy",)) == "incumbent harness_error"
