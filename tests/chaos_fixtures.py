"""A search under chaos, and the figures that say whether it came through honestly.

One search runs on real servers started here -- a Temporal dev server with a SQLite store (so a restart keeps
the workflows), the embedded Postgres, two real `kf worker` processes and a scripted LLM endpoint -- while faults
are injected:

1. Temporal is SIGKILLed while the control activity ``kf.propose`` is in flight (an LLM request arrived and its
   slow reply is still coming), and restarted a little later: the completion is lost.
2. `kf worker` processes are SIGKILLed again and again (and restarted, as a supervisor would), and sandboxed
   harness processes are SIGKILLed from outside as the OOM killer would.
3. Postgres is stopped for a minute, with more worker kills meanwhile.

Meanwhile `kf search show --wait` follows the search as a user would. Figures (``ChaosReport``):
``faults_injected``, ``events_lost`` (outcomes the record implies but lacks), ``duplicate_outcomes`` (a step
recorded twice), ``false_verdicts`` (an infrastructure failure recorded, summarised or counted as a kernel's
verdict, or a failure verdict a fault-free judgement contradicts) and ``max_stall_s`` (the longest stretch
without progress while every server was up).

tests/test_chaos.py asserts them; bench/chaos.py prints them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from scripted_llm_server import ScriptedLLMServer, chat, slow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from engine.evidence.events import RecordedEvent
from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore
from engine.harness.cpu import compile_source
from engine.harness.machine import machine_limits
from engine.harness.noise import machine_noise_floor
from engine.harness.sandbox import HARNESS_WORKER
from engine.harness.validation import validate_artifact
from engine.outages import is_kernel_outcome
from engine.problems import load_problem
from engine.search.audit import audit_search
from engine.search.history import STEP_EVENTS, SearchHistory, load_search_history, stream_of
from engine.search.spec import control_queue
from engine.search.state import SearchResult
from engine.services import postgres_server, temporal_binary
from engine.services.paths import StatePaths
from engine.services.temporal_server import SEARCH_ATTRIBUTES

KF = str(Path(sys.executable).with_name("kf"))
MODEL = "openai/test-model"
LLM_DELAY_S = 3.0
"""How long the scripted model takes to answer: the window in which a proposal is in flight."""
NO_CODE = "No code this time; an online softmax may pay."


@dataclass
class ChaosConfig:
    """The search and the faults."""

    generations: int = 3
    candidates: int = 2
    workers: int = 2
    storm_kills: int = 7
    """Kills while generation 1 is evaluated; every third one hits a sandboxed harness process if one runs."""
    outage_kills: int = 4
    """`kf worker` kills while Postgres is down."""
    temporal_outage_s: float = 15.0
    postgres_outage_s: float = 60.0
    finish_timeout_s: float = 300.0
    seed: int = 20261130


@dataclass
class Fault:
    """One injected fault: what, and when (wall clock, seconds since the epoch)."""

    kind: str
    began: float
    ended: float
    outage: bool = False
    """True for a server outage: nothing can progress meanwhile, so it is not counted as a stall."""


@dataclass
class ChaosReport:
    """What came of one chaotic search."""

    search_id: str
    result: SearchResult | None
    faults: list[Fault]
    events_lost: int
    duplicate_outcomes: int
    false_verdicts: int
    max_stall_s: float
    audit_clean: bool
    follower_exit: int | None
    follower_stderr: str
    worker_exits: int
    problems: list[str] = field(default_factory=list)
    """One line per lost event, duplicate or false verdict, saying which."""

    @property
    def faults_injected(self) -> int:
        return len(self.faults)

    def figures(self) -> dict[str, Any]:
        kinds = Counter(f.kind for f in self.faults)
        return {
            "faults_injected": self.faults_injected,
            "events_lost": self.events_lost,
            "duplicate_outcomes": self.duplicate_outcomes,
            "false_verdicts": self.false_verdicts,
            "max_stall_s": round(self.max_stall_s, 1),
            "faults": dict(sorted(kinds.items())),
            "search_status": self.result.status if self.result else None,
            "candidates_judged": self.result.candidates_done if self.result else None,
            "harness_errors": self.result.harness_errors if self.result else None,
            "audit_clean": self.audit_clean,
            "follower_exit": self.follower_exit,
            "follower_waited_out_temporal": "Temporal unreachable, retrying" in self.follower_stderr,
            "worker_exits_on_their_own": self.worker_exits,
            "problems": self.problems,
        }


# -- servers that can be killed and brought back ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RestartableTemporal:
    """A Temporal dev server whose SQLite store outlives it: killed and started again on the same address."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        argv = [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--db-filename",
            str(self.folder / "temporal.db"),
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--headless",
            "--log-level",
            "error",
        ]
        for name, kind in SEARCH_ATTRIBUTES.items():
            argv += ["--search-attribute", f"{name}={kind}"]
        with (self.folder / "temporal.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while True:
            try:
                client = await Client.connect(self.address, data_converter=pydantic_data_converter)
                await client.workflow_service.get_system_info(_system_info_request())
                return
            except Exception as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    logged = self.folder / "temporal.log"
                    raise RuntimeError(f"the Temporal dev server did not start; see {logged}") from error
                await asyncio.sleep(0.3)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def _system_info_request() -> Any:
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    return GetSystemInfoRequest()


class RestartablePostgres:
    """The embedded Postgres (engine/services/postgres_server.py) in a state folder of its own."""

    def __init__(self, home: Path) -> None:
        self.paths = StatePaths.of(home)
        self.url = ""
        """The application role's URL: what workers and the CLI use."""
        self.owner_url = ""
        """The owner role's URL: what migrations use."""

    def start(self) -> None:
        with _without_overrides():
            postgres_server.start(self.paths, [])
            record = postgres_server.running(self.paths, [])
        assert record is not None
        self.url, self.owner_url = record.url, record.owner_url or record.url

    def stop(self) -> None:
        with _without_overrides():
            postgres_server.stop(self.paths, [])


@contextlib.contextmanager
def _without_overrides() -> Iterator[None]:
    """The embedded services are left alone while KF_DATABASE_URL or KF_TEMPORAL_ADDRESS is set."""
    saved = {k: os.environ.pop(k) for k in ("KF_DATABASE_URL", "KF_TEMPORAL_ADDRESS") if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class WorkerFleet:
    """`kf worker` processes on one task queue prefix, restarted when killed (as systemd would)."""

    def __init__(self, count: int, prefix: str, env: dict[str, str], logs: Path) -> None:
        self.prefix = prefix
        self.env = env
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []
        self.spawned = 0
        self.exits = 0
        for _ in range(count):
            self.processes.append(self._spawn())

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.spawned += 1
        with (self.logs / f"worker-{self.spawned}.log").open("ab") as log:
            return subprocess.Popen(
                [KF, "worker", "--prefix", self.prefix, "--identity", f"chaos-worker-{self.spawned}"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self, index: int) -> None:
        """SIGKILL one worker (no goodbye) and start a new one in its place."""
        process = self.processes[index]
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.processes[index] = self._spawn()

    def supervise(self) -> None:
        """Start a new worker in place of any that exited on its own."""
        for index, process in enumerate(self.processes):
            if process.poll() is not None:
                self.exits += 1
                self.processes[index] = self._spawn()

    def sandboxed_harness(self) -> list[psutil.Process]:
        """The sandboxed harness workers (validation or timing) running under the fleet right now."""
        found = []
        for process in self.processes:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(process.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if child.cmdline()[2:3] == [str(HARNESS_WORKER)]:
                            found.append(child)
        return found

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()


# -- the scenario -------------------------------------------------------------------------------------------------


@dataclass
class _Stack:
    folder: Path
    temporal: RestartableTemporal
    postgres: RestartablePostgres
    llm: ScriptedLLMServer
    env: dict[str, str]


@contextlib.asynccontextmanager
async def chaos_stack(folder: Path) -> AsyncIterator[_Stack]:
    """The servers of one chaotic search, stopped (and their folder kept, for logs) at the end."""
    temporal = RestartableTemporal(folder)
    postgres = RestartablePostgres(folder / "pg")
    await temporal.start()
    try:
        await asyncio.to_thread(postgres.start)
        try:
            await migrate(postgres.owner_url)
            with ScriptedLLMServer() as llm:
                # Every request gets a slow reply without code: each proposal stays in flight for LLM_DELAY_S,
                # and the offline proposer of the `mixed` swarm fills the generation.
                llm.script(*(slow(chat(NO_CODE), LLM_DELAY_S) for _ in range(200)))
                env = dict(os.environ)
                env |= {
                    "KF_DATABASE_URL": postgres.url,
                    "KF_TEMPORAL_ADDRESS": temporal.address,
                    "KF_HOME": str(folder / "kf-home"),
                    "KF_MACHINE_DIR": os.environ.get("KF_MACHINE_DIR") or str(folder / "machine"),
                    "KF_LLM_API_BASE": llm.api_base,
                    "KF_LLM_API_KEY": "sk-test",
                    "KF_LLM_MAX_ATTEMPTS": "1",
                    "KF_LLM_CONCURRENCY": "2",
                }
                env.pop("KF_MODELS", None)
                yield _Stack(folder, temporal, postgres, llm, env)
        finally:
            await asyncio.to_thread(postgres.stop)
    finally:
        temporal.kill()


async def run_chaos(config: ChaosConfig, folder: Path | None = None) -> ChaosReport:
    """Run one search through the faults of the module docstring and measure how it came through."""
    folder = folder or Path(tempfile.mkdtemp(prefix="kf-chaos-"))
    rng = random.Random(config.seed)
    async with chaos_stack(folder) as stack:
        # This machine's bandwidth and noise floor are measured once, before the clock starts (the workers read
        # them from KF_MACHINE_DIR): a measurement is no fault, and killing one would only repeat it.
        os.environ.setdefault("KF_MACHINE_DIR", stack.env["KF_MACHINE_DIR"])
        await asyncio.to_thread(machine_limits, 1)
        await asyncio.to_thread(machine_noise_floor, 1)
        client = await Client.connect(stack.temporal.address, data_converter=pydantic_data_converter)
        prefix = f"chaos-{uuid.uuid4().hex[:6]}"
        fleet = WorkerFleet(config.workers, prefix, stack.env, folder)
        faults: list[Fault] = []
        search_id = f"search-chaos-{uuid.uuid4().hex[:8]}"
        follower: subprocess.Popen[bytes] | None = None
        # Watches progress, so each fault lands where it hurts: on a proposal, on steps being evaluated.
        watcher = await EventStore.connect(stack.postgres.url, max_size=2)

        async def compiled() -> int:
            count: int = await watcher.pool.fetchval(
                "SELECT count(*) FROM events WHERE stream_id = $1 AND type = 'candidate.compiled'",
                stream_of(search_id),
            )
            return count

        try:
            await client.start_workflow(
                "KernelSearch",
                {
                    "problem": "softmax",
                    "generations": config.generations,
                    "candidates_per_generation": config.candidates,
                    "proposer": {"kind": "mixed", "models": [MODEL]},
                    "benchmark_seconds": 0.2,
                    "heartbeat_seconds": 5,
                    "worker_wait_seconds": 120,
                    "seed": config.seed % 1000,
                    "task_queue_prefix": prefix,
                },
                id=search_id,
                task_queue=control_queue(prefix),
                result_type=SearchResult,
            )
            started = time.time()
            with (folder / "follower.out").open("wb") as out, (folder / "follower.err").open("wb") as err:
                follower = subprocess.Popen(
                    [KF, "search", "show", search_id, "--wait"], env=stack.env, stdout=out, stderr=err
                )

            # 1. Temporal dies while a proposal is in flight (an LLM request arrived; its reply is coming).
            await _until(lambda: len(stack.llm.requests) > 0, timeout=240, what="the first proposal")
            began = time.time()
            stack.temporal.kill()
            await asyncio.sleep(1.0)
            fleet.kill(rng.randrange(config.workers))  # and a worker, while nothing can be reported
            faults.append(Fault("worker_sigkill", time.time(), time.time()))
            await asyncio.sleep(max(0.0, config.temporal_outage_s - (time.time() - began)))
            await stack.temporal.start()
            faults.append(Fault("temporal_restart", began, time.time(), outage=True))

            # 2. Workers and sandboxed harness processes killed from outside, again and again, while the first
            # proposed generation is evaluated.
            await _until_async(lambda: _at_least(compiled, 2), timeout=300, what="generation 1's first compile")
            for kill in range(config.storm_kills):
                await asyncio.sleep(rng.uniform(2.0, 4.0))
                fleet.supervise()
                victims = fleet.sandboxed_harness() if kill % 3 == 2 else []
                if victims:
                    for victim in victims[:1]:
                        with contextlib.suppress(psutil.Error):
                            victim.send_signal(signal.SIGKILL)
                    faults.append(Fault("harness_sigkill", time.time(), time.time()))
                else:
                    fleet.kill(rng.randrange(config.workers))
                    faults.append(Fault("worker_sigkill", time.time(), time.time()))

            # 3. Postgres down for a minute while a later generation is evaluated; workers killed meanwhile must
            # wait for it when they come back.
            await _until_async(lambda: _at_least(compiled, 4), timeout=300, what="generation 2's first compile")
            began = time.time()
            await asyncio.to_thread(stack.postgres.stop)
            for _ in range(config.outage_kills):
                await asyncio.sleep(config.postgres_outage_s / (config.outage_kills + 1))
                fleet.kill(rng.randrange(config.workers))
                faults.append(Fault("worker_sigkill", time.time(), time.time()))
            await asyncio.sleep(max(0.0, config.postgres_outage_s - (time.time() - began)))
            await asyncio.to_thread(stack.postgres.start)
            faults.append(Fault("postgres_outage", began, time.time(), outage=True))
            last_fault = time.time()

            handle = client.get_workflow_handle(search_id, result_type=SearchResult)
            waiting = asyncio.ensure_future(handle.result())
            deadline = last_fault + config.finish_timeout_s
            while not waiting.done() and time.time() < deadline:
                fleet.supervise()
                await asyncio.wait({waiting}, timeout=2.0)
            if not waiting.done():
                waiting.cancel()
            result: SearchResult | None = waiting.result() if waiting.done() and not waiting.cancelled() else None
            finished = time.time()
            follower_exit: int | None = None
            with contextlib.suppress(subprocess.TimeoutExpired):
                follower_exit = follower.wait(timeout=60)
        finally:
            fleet.stop()
            await watcher.close()
            if follower is not None and follower.poll() is None:
                follower.kill()
                follower.wait()

        store = await EventStore.connect(stack.postgres.url)
        try:
            events = await store.read_stream(stream_of(search_id))
            history = await load_search_history(store, search_id)
            broken = await store.verify(stream_of(search_id))
        finally:
            await store.close()
        audit = await audit_search(stack.postgres.url, search_id)
        report = ChaosReport(
            search_id=search_id,
            result=result,
            faults=faults,
            events_lost=0,
            duplicate_outcomes=0,
            false_verdicts=0,
            max_stall_s=max_stall(events, faults, started, finished),
            audit_clean=False,
            follower_exit=follower_exit,
            follower_stderr=(folder / "follower.err").read_text(errors="replace"),
            worker_exits=fleet.exits,
        )
        _count_lost_and_duplicates(report, events, history)
        await _count_false_verdicts(report, events, history, folder / "rejudge")
        finished_payload = next((e.payload for e in events if e.type == "search.finished"), None)
        report.audit_clean = (
            broken is None
            and audit["chain"]["intact"]
            and finished_payload is not None
            and audit["verdict_counts"] == finished_payload.get("verdict_counts")
        )
        return report


async def _at_least(count: Callable[[], Awaitable[int]], wanted: int) -> bool:
    return await count() >= wanted


async def _until_async(condition: Callable[[], Awaitable[bool]], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}: the search may have ended before the faults")
        await asyncio.sleep(0.2)


async def _until(condition: Any, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        await asyncio.sleep(0.1)


# -- figures --------------------------------------------------------------------------------------------------------


def max_stall(events: list[RecordedEvent], faults: list[Fault], started: float, finished: float) -> float:
    """The longest stretch a fault left the search without progress while every server was up: each gap
    between consecutive events (and from the start, and to the end) that a fault fell in, less the time a
    server outage covered of it. A gap no fault touched is work (a step timed on a busy machine), not a stall."""
    times = sorted([started, finished, *(_epoch(e.recorded_at) for e in events)])
    outages = [(f.began, f.ended) for f in faults if f.outage]
    longest = 0.0
    for a, b in itertools.pairwise(times):
        if not any(f.began <= b and f.ended >= a for f in faults):
            continue
        covered = sum(max(0.0, min(b, end) - max(a, begin)) for begin, end in outages)
        longest = max(longest, b - a - covered)
    return longest


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def _deciding_step(record: Any, verdict: str) -> str | None:
    """The step whose outcome gave ``verdict``: the benchmark for ok, else the first step that recorded it."""
    if verdict == "ok":
        return STEP_EVENTS[-1]
    return next((s for s in STEP_EVENTS if s in record.steps and _verdict(record.steps[s]) == verdict), None)


def _verdict(event: RecordedEvent) -> str:
    return str(event.payload.get("output", {}).get("verdict"))


def _count_lost_and_duplicates(report: ChaosReport, events: list[RecordedEvent], history: SearchHistory) -> None:
    """Duplicates: a (candidate, step) recorded twice, or two harness errors for one candidate. Lost: what the
    record's own summaries imply but the log lacks."""
    per_step = Counter(
        (e.payload["candidate_id"], e.type) for e in events if e.type in (*STEP_EVENTS, "candidate.harness_error")
    )
    for (cid, step), count in per_step.items():
        if count > 1:
            report.duplicate_outcomes += count - 1
            report.problems.append(f"duplicate: {step} of {cid[:12]} recorded {count} times")
    types = Counter(e.type for e in events)
    for needed in ("search.started", "search.target_resolved", "search.finished"):
        if types[needed] != 1:
            report.events_lost += 1
            report.problems.append(f"lost: {needed} appears {types[needed]} times")
    completed = [e.payload for e in events if e.type == "generation.completed"]
    generations_run = report.result.generations_run if report.result else len(completed)
    if len(completed) != generations_run:
        report.events_lost += abs(generations_run - len(completed))
        report.problems.append(f"lost: {len(completed)} generation.completed for {generations_run} generations")
    for payload in completed:
        for outcome in payload["outcomes"]:
            cid, verdict = outcome["candidate_id"], outcome["verdict"]
            record = history.candidates.get(cid)
            if record is None:
                report.events_lost += 1
                report.problems.append(f"lost: every event of {cid[:12]}")
                continue
            if verdict == "harness_error":
                if record.harness_error is None:
                    report.events_lost += 1
                    report.problems.append(f"lost: candidate.harness_error of {cid[:12]}")
                continue
            deciding = _deciding_step(record, verdict)
            if deciding is None:
                report.events_lost += 1
                report.problems.append(f"lost: the step outcome that made {cid[:12]} {verdict}")
                continue
            for step in STEP_EVENTS[: STEP_EVENTS.index(deciding) + 1]:
                if step not in record.steps:
                    report.events_lost += 1
                    report.problems.append(f"lost: {step} of {cid[:12]} (outcome {verdict})")


async def _count_false_verdicts(
    report: ChaosReport, events: list[RecordedEvent], history: SearchHistory, rejudge: Path
) -> None:
    """A verdict is false when an infrastructure failure is recorded, summarised or counted as the kernel's, or
    when a failure verdict does not hold up when the candidate is judged again with no fault injected."""
    for event in events:
        if event.type not in STEP_EVENTS:
            continue
        signum = (event.payload.get("evidence") or {}).get("signal")
        if not is_kernel_outcome(_verdict(event), signum if isinstance(signum, int) else None):
            report.false_verdicts += 1
            report.problems.append(f"false: {event.type} {_verdict(event)} of {event.payload['candidate_id'][:12]}")
    judged = {cid: rec.verdict for cid, rec in history.candidates.items()}
    for event in events:
        if event.type != "generation.completed":
            continue
        for outcome in event.payload["outcomes"]:
            if judged.get(outcome["candidate_id"]) != outcome["verdict"]:
                report.false_verdicts += 1
                report.problems.append(
                    f"false: generation {event.payload['generation']} summarises {outcome['candidate_id'][:12]} as "
                    f"{outcome['verdict']}; its steps say {judged.get(outcome['candidate_id'])}"
                )
    finished = next((e.payload for e in events if e.type == "search.finished"), None)
    if finished is not None and finished.get("verdict_counts") != history.verdict_counts:
        counted, recorded = Counter(finished.get("verdict_counts") or {}), Counter(history.verdict_counts)
        report.false_verdicts += sum(((counted - recorded) + (recorded - counted)).values())
        report.problems.append(f"false: search.finished counts {dict(counted)}; the steps say {dict(recorded)}")
    # Every compile or validation failure is judged again with no fault injected: compiled again, validated
    # again with the step's own seed (the search's seed plus the generation).
    problem = load_problem("softmax")
    started = next(e.payload for e in events if e.type == "search.started")
    proposed = {
        e.payload["candidate"]["candidate_id"]: e.payload["candidate"] for e in events if e.type == "candidate.proposed"
    }
    for cid, record in history.candidates.items():
        deciding = _deciding_step(record, record.verdict)
        candidate = proposed.get(cid)
        if record.verdict == "ok" or candidate is None or deciding not in STEP_EVENTS[:2]:
            continue
        again = await asyncio.to_thread(
            compile_source, problem, candidate["source"], candidate.get("flags"), cache_dir=rejudge
        )
        verdict = str(again.verdict)
        if deciding == "candidate.validated" and again.artifact_id:
            generation = int(record.steps[deciding].payload.get("generation") or 0)
            validation = await asyncio.to_thread(
                validate_artifact,
                problem,
                again.artifact_id,
                base_seed=int(started["spec"].get("seed", 0)) + generation,
                cache_dir=rejudge,
            )
            verdict = str(validation.verdict)
        if verdict != record.verdict:
            report.false_verdicts += 1
            report.problems.append(f"false: {cid[:12]} recorded {record.verdict}, judged again {verdict}")
