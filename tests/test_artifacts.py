"""Built artifacts any worker can fetch: the shared artifact store, the worker's cache in front of it, and searches
whose steps land on different machines.

- The store (engine/evidence/artifacts.py) against a real Postgres: put and get, idempotent put (first writer
  wins), bytes that do not hash to their digest refused on insert and on fetch, changes refused by the database.
- The cache (engine/harness/cpu.py): fetched artifacts are installed atomically; a half-written file left by a
  killed worker is never read.
- The activities: a validation on a worker that did not compile fetches the artifact; an artifact nobody has is
  a retryable failure of the machine, never the kernel's verdict.
- End to end, with real `kf worker` processes that have separate state folders (so separate caches) on one
  Temporal and one Postgres: every candidate that validates is benchmarked, and a worker killed in the middle of
  a fetch costs nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from search_fixtures import COPY_PROBLEM, QUICK, start
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.search import SearchActivities
from engine.errors import ArtifactConflict, ArtifactCorrupt, MigrationError
from engine.evidence.artifacts import ArtifactStore, digest_of
from engine.evidence.store import EventStore
from engine.harness.cpu import ARTIFACT_KIND, artifact_path, cached_artifact, compile_source, install_artifact
from engine.problems import load_problem
from engine.search.candidates import Candidate
from engine.search.history import STEP_EVENTS, stream_of
from engine.search.state import SearchResult
from engine.search.steps import StepInput

ID_A = "a" * 64
ID_B = "b" * 64


@pytest.fixture
def artifacts(store: EventStore) -> ArtifactStore:
    return ArtifactStore(store.pool)


# -- the store -------------------------------------------------------------------------------------------------


async def test_put_then_get_returns_the_bytes_with_their_digest(artifacts: ArtifactStore) -> None:
    data = b"\x7fELF" + bytes(range(256)) * 40
    stored = await artifacts.put(ID_A, ARTIFACT_KIND, data)
    assert (stored.artifact_id, stored.kind, stored.size) == (ID_A, ARTIFACT_KIND, len(data))
    assert stored.digest == hashlib.sha256(data).hexdigest()

    fetched = await artifacts.get(ID_A)
    assert fetched is not None and fetched.data == data
    assert fetched.digest == stored.digest and fetched.stored_at == stored.stored_at
    assert await artifacts.describe(ID_A) == stored
    assert await artifacts.get(ID_B) is None and await artifacts.describe(ID_B) is None
    await artifacts.check_migrated()


async def test_put_is_idempotent_and_the_first_build_wins(artifacts: ArtifactStore, store: EventStore) -> None:
    first = await artifacts.put(ID_A, ARTIFACT_KIND, b"first build")
    assert await artifacts.put(ID_A, ARTIFACT_KIND, b"first build") == first
    # Another build of the same id (a compiler that is not reproducible): the stored one is returned, and the
    # caller adopts it, so one id names one binary on every worker.
    again = await artifacts.put(ID_A, ARTIFACT_KIND, b"second build")
    assert again == first and again.digest == digest_of(b"first build")
    fetched = await artifacts.get(ID_A)
    assert fetched is not None and fetched.data == b"first build"
    assert await store.pool.fetchval("SELECT count(*) FROM artifacts") == 1

    with pytest.raises(ArtifactConflict, match="stored as 'shared_library', not 'cubin'"):
        await artifacts.put(ID_A, "cubin", b"first build")


async def test_concurrent_first_puts_store_one_artifact(artifacts: ArtifactStore, store: EventStore) -> None:
    builds = [f"build {i}".encode() for i in range(8)]
    results = await asyncio.gather(*(artifacts.put(ID_A, ARTIFACT_KIND, data) for data in builds))
    assert len({r.digest for r in results}) == 1
    assert await store.pool.fetchval("SELECT count(*) FROM artifacts") == 1


async def test_bytes_that_do_not_hash_to_their_digest_are_refused(store: EventStore) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match="artifacts_digest_is_sha256_of_data"):
        await store.pool.execute(
            "INSERT INTO artifacts (artifact_id, kind, digest, size, data) VALUES ($1, $2, $3, $4, $5)",
            ID_A,
            ARTIFACT_KIND,
            digest_of(b"what the writer claims"),
            5,
            b"other",
        )
    with pytest.raises(asyncpg.CheckViolationError, match="artifacts_size_is_length_of_data"):
        await store.pool.execute(
            "INSERT INTO artifacts (artifact_id, kind, digest, size, data) VALUES ($1, $2, $3, $4, $5)",
            ID_A,
            ARTIFACT_KIND,
            digest_of(b"bytes"),
            4,
            b"bytes",
        )


async def test_a_stored_artifact_cannot_be_changed_or_removed(artifacts: ArtifactStore, store: EventStore) -> None:
    await artifacts.put(ID_A, ARTIFACT_KIND, b"kernel")
    statements = [
        "UPDATE artifacts SET data = 'tampered'::bytea",
        "UPDATE artifacts SET kind = 'cubin' WHERE artifact_id = 'nothing matches'",
        "DELETE FROM artifacts",
        "TRUNCATE artifacts",
    ]
    async with store.pool.acquire() as connection:
        for replica in (False, True):
            if replica:  # a role that silences ordinary triggers does not silence this one
                await connection.execute("SET session_replication_role = replica")
            for statement in statements:
                with pytest.raises(asyncpg.PostgresError, match="refused: a stored artifact is immutable") as error:
                    await connection.execute(statement)
                assert error.value.sqlstate == "KF003"
        await connection.execute("RESET session_replication_role")
    fetched = await artifacts.get(ID_A)
    assert fetched is not None and fetched.data == b"kernel"


async def test_a_fetch_refuses_bytes_altered_behind_the_tables_back(
    artifacts: ArtifactStore, store: EventStore
) -> None:
    await artifacts.put(ID_A, ARTIFACT_KIND, b"the kernel that was judged")
    # Only the table's owner can do this: drop the digest check and disable the immutability trigger.
    async with store.pool.acquire() as connection:
        await connection.execute("ALTER TABLE artifacts DROP CONSTRAINT artifacts_digest_is_sha256_of_data")
        await connection.execute("ALTER TABLE artifacts DISABLE TRIGGER artifacts_immutable")
        await connection.execute("UPDATE artifacts SET data = 'the kernel that was judgeX'::bytea")
    with pytest.raises(ArtifactCorrupt, match=f"artifact {ID_A} in the store is corrupt"):
        await artifacts.get(ID_A)


async def test_a_database_without_the_artifacts_table_is_refused_with_the_fix(fresh_db_url: str) -> None:
    pool = await asyncpg.create_pool(fresh_db_url, min_size=1, max_size=1)
    try:
        with pytest.raises(MigrationError, match="kf db migrate"):
            await ArtifactStore(pool).check_migrated()
    finally:
        await pool.close()


# -- the cache -------------------------------------------------------------------------------------------------


def test_install_is_atomic_and_a_half_written_file_is_never_read(tmp_path: Path) -> None:
    final = artifact_path(ID_A, tmp_path)
    assert cached_artifact(ID_A, tmp_path) is None
    # What a worker killed mid-fetch leaves behind: a partial temporary next to where the library goes.
    final.parent.mkdir(parents=True)
    leftover = final.with_name(".kernel.so.killed")
    leftover.write_bytes(b"\x7fELF half of it")
    assert cached_artifact(ID_A, tmp_path) is None, "a partial temporary is not the artifact"

    assert install_artifact(ID_A, b"\x7fELF whole", tmp_path) == final
    assert cached_artifact(ID_A, tmp_path) == b"\x7fELF whole"
    assert oct(final.stat().st_mode & 0o777) == oct(0o644)
    # Installing again (another build adopted from the store) replaces the entry whole.
    install_artifact(ID_A, b"\x7fELF adopted", tmp_path)
    assert final.read_bytes() == b"\x7fELF adopted"
    assert sorted(p.name for p in final.parent.iterdir()) == [".kernel.so.killed", "kernel.so"]


# -- the activities --------------------------------------------------------------------------------------------


def seed_step(search_id: str) -> StepInput:
    problem = load_problem("bias_gelu")
    seed = Candidate.create(problem.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    return StepInput(search_id=search_id, generation=0, problem="bias_gelu", candidate=seed, seed=7)


async def test_a_worker_that_did_not_compile_fetches_the_artifact_to_validate(
    store: EventStore, tmp_path: Path
) -> None:
    compiler = SearchActivities(store, identity="compiler", cache_dir=tmp_path / "compiler")
    validator = SearchActivities(store, identity="validator", cache_dir=tmp_path / "validator")
    env = ActivityEnvironment()
    step = seed_step("search-fetch")

    compiled = await env.run(compiler.compile, step)
    assert compiled.verdict == "ok" and compiled.artifact_id
    built = artifact_path(compiled.artifact_id, tmp_path / "compiler").read_bytes()
    stored = await ArtifactStore(store.pool).describe(compiled.artifact_id)
    assert stored is not None and stored.digest == digest_of(built)
    # The outcome names the bytes it stored, in the hash-chained log.
    event = next(e for e in await store.read_stream(stream_of("search-fetch")) if e.type == "candidate.compiled")
    assert event.payload["evidence"]["artifact"] == {"kind": ARTIFACT_KIND, "digest": stored.digest, "size": len(built)}

    assert cached_artifact(compiled.artifact_id, tmp_path / "validator") is None
    validated = await env.run(validator.validate, step.model_copy(update={"artifact_id": compiled.artifact_id}))
    assert validated.verdict == "ok", validated.summary
    assert cached_artifact(compiled.artifact_id, tmp_path / "validator") == built


async def test_an_artifact_nobody_has_fails_the_step_for_a_retry_and_records_no_verdict(
    store: EventStore, tmp_path: Path
) -> None:
    worker = SearchActivities(store, identity="lonely", cache_dir=tmp_path / "cache")
    step = seed_step("search-missing").model_copy(update={"artifact_id": "c" * 64, "incumbent_artifact_id": ID_B})
    for activity in (worker.validate, worker.benchmark):
        with pytest.raises(ApplicationError, match="in neither this worker's cache") as error:
            await ActivityEnvironment().run(activity, step)
        assert error.value.type == "ArtifactUnavailable" and not error.value.non_retryable
    assert await store.read_stream(stream_of("search-missing")) == []


async def test_a_compile_adopts_the_build_another_worker_stored_first(store: EventStore, tmp_path: Path) -> None:
    step = seed_step("search-adopt")
    worker = SearchActivities(store, identity="second", cache_dir=tmp_path / "cache")
    # Another machine built the same artifact id first, with other bytes (a compiler that is not reproducible).
    problem = load_problem("bias_gelu")
    own = compile_source(problem, step.candidate.source, None, cache_dir=tmp_path / "scratch")
    assert own.artifact_id
    theirs = artifact_path(own.artifact_id, tmp_path / "scratch").read_bytes() + b"\0other build"
    await ArtifactStore(store.pool).put(own.artifact_id, ARTIFACT_KIND, theirs)

    compiled = await ActivityEnvironment().run(worker.compile, step)
    assert compiled.artifact_id == own.artifact_id
    assert cached_artifact(own.artifact_id, tmp_path / "cache") == theirs
    event = next(e for e in await store.read_stream(stream_of("search-adopt")) if e.type == "candidate.compiled")
    assert event.payload["evidence"]["artifact"]["digest"] == digest_of(theirs)


# -- end to end: real workers on separate machines -------------------------------------------------------------

KF = str(Path(sys.executable).with_name("kf"))
# Generous: two workers, a Temporal server and Postgres share two noisy cores with other test sessions. A
# search here takes one to three minutes on a quiet machine.
SEARCH_TIMEOUT_S = 600

# A `kf worker` whose first artifact fetch stops half-way through writing its temporary file and waits to be
# killed: the bytes are partly on disk, the rename into the cache has not happened. It names the temporary in
# the marker file when it gets there.
HANGING_WORKER = """
import os, sys, time
marker = sys.argv.pop(1)
real_fsync = os.fsync

def fsync_then_hang(fd):
    name = os.readlink(f"/proc/self/fd/{fd}")
    if "/artifacts/" in name and os.path.basename(name).startswith(".kernel.so.") and not os.path.exists(marker):
        os.ftruncate(fd, os.fstat(fd).st_size // 2)
        with open(marker + ".part", "w") as out:
            out.write(name)
        os.replace(marker + ".part", marker)
        time.sleep(3600)
    real_fsync(fd)

os.fsync = fsync_then_hang
import cli
sys.exit(cli.main(sys.argv[1:]))
"""


class Machines:
    """`kf worker` processes, each with a state folder (and so an artifact cache) of its own."""

    def __init__(self, client: Client, db_url: str, prefix: str, root: Path) -> None:
        self.prefix = prefix
        self.root = root
        self.env = dict(os.environ)
        self.env["KF_DATABASE_URL"] = db_url
        self.env["KF_TEMPORAL_ADDRESS"] = client.service_client.config.target_host
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def home(self, name: str) -> Path:
        return self.root / name

    def cache(self, name: str) -> Path:
        return self.home(name) / "cache"

    def start(self, name: str, *, hang_at_first_fetch: Path | None = None) -> None:
        env = self.env | {"KF_HOME": str(self.home(name))}
        worker = ["worker", "--prefix", self.prefix, "--identity", name]
        command = [KF, *worker]
        if hang_at_first_fetch is not None:
            command = [sys.executable, "-c", HANGING_WORKER, str(hang_at_first_fetch), *worker]
        with (self.root / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def kill_all(self) -> None:
        for name in list(self.processes):
            self.kill(name)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))


@pytest.fixture
def machines(client: Client, store: EventStore, fresh_db_url: str, prefix: str, tmp_path: Path) -> Iterator[Machines]:
    # fresh_db_url is the database `store` was built on.
    group = Machines(client, fresh_db_url, prefix, tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


async def wait_for(what: str, check: Any, timeout: float, machines: Machines) -> Any:
    """Poll ``check`` (async) until it returns something truthy; fail with the workers' logs after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{machines.logs()}")


async def finished(handle: WorkflowHandle[Any, SearchResult], machines: Machines) -> SearchResult:
    """The search's result; fails with the workers' logs when it does not finish in SEARCH_TIMEOUT_S."""
    try:
        return await asyncio.wait_for(handle.result(), timeout=SEARCH_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"search {handle.id} did not finish in {SEARCH_TIMEOUT_S} s\n{machines.logs()}")


async def assert_every_correct_candidate_benchmarked(store: EventStore, search_id: str) -> list[Any]:
    """The record is whole: one outcome per (candidate, step), no harness failure, and every candidate whose
    validation is ok has a benchmark outcome (what went missing when workers could not fetch artifacts)."""
    events = await store.read_stream(stream_of(search_id))
    steps = Counter((e.payload["candidate_id"], e.type) for e in events if e.type in STEP_EVENTS)
    assert steps and max(steps.values()) == 1, steps.most_common(3)
    failures = [e.payload for e in events if e.type == "candidate.harness_error"]
    assert not failures, failures
    validated_ok = {
        e.payload["candidate_id"]
        for e in events
        if e.type == "candidate.validated" and e.payload["output"]["verdict"] == "ok"
    }
    benchmarked = {cid for cid, step in steps if step == "candidate.benchmarked"}
    assert validated_ok and validated_ok <= benchmarked, validated_ok - benchmarked
    assert await store.verify(stream_of(search_id)) is None
    return events


async def assert_caches_hold_the_stored_bytes(store: EventStore, search_id: str, *caches: Path) -> None:
    """Every artifact the search built is in the store, and whatever a worker's cache holds under its id is
    exactly the stored bytes. (A cache holds the harness's own builds too, such as the noise calibration's.)"""
    artifacts = ArtifactStore(store.pool)
    built = {
        e.payload["output"]["artifact_id"]
        for e in await store.read_stream(stream_of(search_id))
        if e.type == "candidate.compiled" and e.payload["output"]["verdict"] == "ok"
    }
    assert built
    for artifact_id in built:
        stored = await artifacts.describe(artifact_id)
        assert stored is not None, f"artifact {artifact_id} was never stored"
        for cache in caches:
            library = artifact_path(artifact_id, cache)
            if library.exists():
                assert digest_of(library.read_bytes()) == stored.digest, library


@pytest.mark.slow
@pytest.mark.timeout(2 * SEARCH_TIMEOUT_S)
async def test_two_workers_with_separate_caches_benchmark_every_correct_candidate(
    machines: Machines, client: Client, store: EventStore, prefix: str
) -> None:
    machines.start("machine-a")
    machines.start("machine-b")
    handle = await start(
        client, prefix, {"problem": COPY_PROBLEM, "generations": 1, "candidates_per_generation": 3, **QUICK}
    )
    result = await finished(handle, machines)
    assert result.status == "completed"
    assert "harness_error" not in result.verdict_counts, result.verdict_counts

    events = await assert_every_correct_candidate_benchmarked(store, handle.id)
    compiled_by = {
        e.payload["output"]["artifact_id"]: e.metadata["worker"] for e in events if e.type == "candidate.compiled"
    }
    assert set(compiled_by.values()) <= {"machine-a", "machine-b"}
    # Steps ran on the machine that did not build what they loaded (the candidate's artifact, or the
    # incumbent's it is timed against): the case that failed before artifacts were shared.
    crossed = [
        e.event_id
        for e in events
        if e.type in ("candidate.validated", "candidate.benchmarked")
        and any(
            compiled_by.get(artifact) not in (None, e.metadata["worker"])
            for artifact in (e.payload["output"]["artifact_id"], _incumbent_of(e))
        )
    ]
    assert crossed, "every step ran where its artifacts were built; the test proved nothing"
    await assert_caches_hold_the_stored_bytes(
        store, handle.id, machines.cache("machine-a"), machines.cache("machine-b")
    )


def _incumbent_of(event: Any) -> str | None:
    """The incumbent artifact a benchmark outcome was timed against, if any."""
    artifact: str | None = (event.payload.get("evidence") or {}).get("incumbent_artifact_id")
    return artifact


@pytest.mark.slow
@pytest.mark.timeout(3 * SEARCH_TIMEOUT_S)
async def test_a_worker_killed_in_the_middle_of_a_fetch_costs_nothing(
    machines: Machines, client: Client, store: EventStore, prefix: str, tmp_path: Path
) -> None:
    # Machine A alone builds the seed, then dies; machine B, with an empty cache, must fetch the seed's
    # artifact for whatever step it takes next (validation, or the benchmark against it as incumbent).
    machines.start("machine-a")
    handle = await start(
        client, prefix, {"problem": COPY_PROBLEM, "generations": 1, "candidates_per_generation": 2, **QUICK}
    )

    async def seed_compiled() -> bool:
        events = await store.read_stream(stream_of(handle.id))
        return any(e.type == "candidate.compiled" and e.payload["output"]["verdict"] == "ok" for e in events)

    await wait_for("machine A to compile the seed", seed_compiled, SEARCH_TIMEOUT_S, machines)
    machines.kill("machine-a")
    marker = tmp_path / "fetching"
    machines.start("machine-b", hang_at_first_fetch=marker)

    async def fetching() -> str | None:
        return marker.read_text() if marker.exists() else None

    temporary = Path(await wait_for("machine B to start fetching", fetching, SEARCH_TIMEOUT_S, machines))
    machines.kill("machine-b")
    assert temporary.parent.parent == machines.cache("machine-b") / "artifacts"
    artifact_id = temporary.parent.name
    assert temporary.exists() and not (temporary.parent / "kernel.so").exists(), "killed before the rename"

    # Both machines come back (B with its half-written temporary still there); the search finishes as if
    # nothing had happened.
    machines.start("machine-a")
    machines.start("machine-b")
    result = await finished(handle, machines)
    assert result.status == "completed"
    assert "harness_error" not in result.verdict_counts, result.verdict_counts
    await assert_every_correct_candidate_benchmarked(store, handle.id)
    await assert_caches_hold_the_stored_bytes(
        store, handle.id, machines.cache("machine-a"), machines.cache("machine-b")
    )
    assert await ArtifactStore(store.pool).describe(artifact_id) is not None
