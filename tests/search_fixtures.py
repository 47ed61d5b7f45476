"""Helpers for search tests: workers on a test's private task queues, and starting searches as the UI does.

The fixtures (``temporal_env``, ``client``, ``prefix``) live in conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from activities.worker import build_workers
from engine.evidence.store import EventStore
from engine.search.spec import control_queue
from engine.search.state import SearchResult

# Small, quick searches: a tenth of a second of timing per candidate keeps a test's search to seconds.
QUICK = {"benchmark_seconds": 0.2, "heartbeat_seconds": 5, "worker_wait_seconds": 30}
COPY_PROBLEM = str(Path(__file__).resolve().parent.parent / "bench" / "problems" / "copy")
"""A trivial problem (a copy: validated and timed in a fraction of softmax's time) for tests of the search's
orchestration rather than of a kernel: resuming, continuing as new, reusing evidence."""


@contextlib.asynccontextmanager
async def running_worker(client: Client, store: EventStore, prefix: str) -> AsyncIterator[None]:
    """An in-process worker on the test's queues, shut down on exit."""
    async with contextlib.AsyncExitStack() as stack:
        for worker in build_workers(client, store, prefix=prefix, identity=f"test-worker-{prefix}"):
            await stack.enter_async_context(worker)
        yield


async def start(
    client: Client, prefix: str, raw: dict[str, Any], search_id: str | None = None
) -> WorkflowHandle[Any, SearchResult]:
    """Start a KernelSearch with exactly the dict given (as the Web UI would), on the test's queues."""
    body = dict(raw)
    body.setdefault("task_queue_prefix", prefix)
    return await client.start_workflow(
        "KernelSearch",
        body,
        id=search_id or f"search-test-{uuid.uuid4().hex[:8]}",
        task_queue=control_queue(prefix),
        result_type=SearchResult,
    )


HISTORIES = Path(__file__).resolve().parent / "histories"


async def keep_history(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """With KF_RECORD_HISTORIES=1, save the search's workflow history for the replay test (determinism guard).

    Regenerate after a deliberate, versioned change to the workflow:
    `KF_RECORD_HISTORIES=1 .venv/bin/pytest tests/test_search.py`.
    """
    if os.environ.get("KF_RECORD_HISTORIES") != "1":
        return
    history = await handle.fetch_history()
    HISTORIES.mkdir(exist_ok=True)
    (HISTORIES / f"{name}.json").write_text(history.to_json())


async def forget(client: Client, search_id: str) -> None:
    """Delete the search's execution from Temporal, as its namespace's retention does once it has closed, and wait
    until Temporal neither describes nor lists it (the deletion completes in the background, the list's store
    later than the execution's)."""
    execution = WorkflowExecution(workflow_id=search_id)
    request = DeleteWorkflowExecutionRequest(namespace=client.namespace, workflow_execution=execution)
    await client.workflow_service.delete_workflow_execution(request)
    for _ in range(300):
        try:
            await client.get_workflow_handle(search_id).describe()
        except RPCError:
            if not [e async for e in client.list_workflows(f"WorkflowId = '{search_id}'")]:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"Temporal still holds {search_id} 30 s after its deletion")
