"""Starting and steering searches from outside: what the CLI (and tests) call on a Temporal client."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import PendingActivityState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from activities.temporal_client import connection_broke, query_timed_out
from engine.evidence.store import EventStore
from engine.search.console import static_details, summary
from engine.search.history import SearchHistory, load_search_history, stream_of
from engine.search.logged_status import logged_status
from engine.search.spec import SearchSpec, control_queue
from engine.search.state import SearchResult, SearchStatus
from workflows.kernel_search import (
    BEST_SPEEDUP_ATTR,
    GENERATION_ATTR,
    PROBLEM_ATTR,
    TARGET_ATTR,
    KernelSearch,
)

# A workflow task that keeps failing is a bug, not bad input (the workflow validates its input itself); cap the
# whole search's life at a generous bound so a forgotten one ends.
SEARCH_TIMEOUT = timedelta(days=30)


def new_search_id(spec: SearchSpec) -> str:
    """A readable, unique search id: `search-softmax-3f9c1a2b`."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", spec.problem.rstrip("/").split("/")[-1]) or "problem"
    return f"search-{name}-{uuid.uuid4().hex[:8]}"


async def start_search(
    client: Client, spec: SearchSpec, search_id: str | None = None
) -> WorkflowHandle[KernelSearch, SearchResult]:
    """Start a KernelSearch on the control queue; the spec travels as the plain dict the UI would send. The UI
    shows the search's summary and details (engine/search/console.py) on its page and in the list."""
    workflow_id = search_id or new_search_id(spec)
    return await client.start_workflow(
        "KernelSearch",
        search_input(spec),
        id=workflow_id,
        task_queue=control_queue(spec.task_queue_prefix),
        result_type=SearchResult,
        search_attributes=search_attributes(spec),
        execution_timeout=SEARCH_TIMEOUT,
        static_summary=summary(spec),
        static_details=static_details(spec),
    )


def search_input(spec: SearchSpec) -> dict[str, Any]:
    """The workflow's input: the fields that differ from their defaults, as a user would type them in the UI."""
    return spec.model_dump(mode="json", exclude_defaults=True) | {"problem": spec.problem}


def search_attributes(spec: SearchSpec) -> TypedSearchAttributes:
    """The list view's columns a search has from its start (the workflow keeps Generation and BestSpeedup)."""
    return TypedSearchAttributes(
        [SearchAttributePair(PROBLEM_ATTR, spec.problem), SearchAttributePair(TARGET_ATTR, spec.target)]
    )


DEADLINE_REACHED = 0.9
"""Share of STATUS_QUERY_TIMEOUT after which a broken connection is taken for the deadline's end."""

STATUS_QUERY_TIMEOUT = timedelta(seconds=10)
"""How long the `status` query may wait for a worker to answer at first. A worker answers within a second; a search
whose queue no worker has ever polled, or whose workers are gone, leaves the query waiting until this deadline
(Temporal's own is 30 s), and is said as "no worker answers" (activities/temporal_client.py no_worker) -- unless a
worker polled the queue while it waited."""
POLLED_LATELY = timedelta(seconds=10)
"""A worker whose last poll of the search's queue is at most this old when the first deadline passes polled while
the query waited (the first deadline is as long): it is alive. A worker that is gone stopped polling before the
query was sent. Compared on Temporal's clock against this machine's: a skew of seconds only moves the line."""
BUSY_WORKER_QUERY_TIMEOUT = timedelta(seconds=60)
"""How long the query may wait again when the first deadline passed but a worker polled the search's queue while
it waited: that worker is there and busy (a closed search's query replays its whole history; on a loaded two-core
machine, with other queries queued before it, that took over ten seconds), not gone."""


# How a closed workflow's state reads where its own status field still said running: it failed, was
# terminated or timed out before it could write how it ended.
_CLOSED = {
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    WorkflowExecutionStatus.CANCELED: "canceled",
}
CLOSED_WITHOUT_RESULT = frozenset(_CLOSED.values())
"""How a search can end without its result (failed, terminated, timed_out, canceled)."""


async def search_status(client: Client, search_id: str) -> SearchStatus:
    """A search's progress (running or closed within retention). A completed search's is read from its result in
    Temporal's history (no worker needed, nor a replay of its history); otherwise the `status` query answers, and a
    closed one is said as it ended: the query answers from the workflow's last state, which says running for one
    that failed."""
    handle = client.get_workflow_handle(search_id, result_type=SearchResult)
    description = await handle.describe()
    how = description.status
    if how == WorkflowExecutionStatus.COMPLETED:
        ended = (await handle.result()).progress
        if ended is not None:  # None: a search that ended before results kept their progress
            return ended
    status = await queried_status(client, search_id)
    if status.status in ("running", "paused"):
        # How Temporal said it stood before the query (one that closes in between is said so at the next look).
        closed = _CLOSED.get(how)  # type: ignore[arg-type]
        if closed is not None:
            status = status.model_copy(update={"status": closed, "step": ""})
        else:
            status = status.model_copy(update={"waiting": await waiting_for(client, description)})
    return status


WAIT_NOTICE_S = 3.0
"""A step scheduled this long ago and not started is looked into: a free worker starts one within milliseconds, so
only a worker that is just starting is spared the note."""

LIVE_POLL = timedelta(seconds=75)
"""A worker whose last poll is older than this reads as gone: an idle worker's long poll returns and is sent again
within about a minute, while Temporal keeps listing a poller for minutes after its last poll."""


async def waiting_for(client: Client, description: WorkflowExecutionDescription) -> list[str]:
    """What a running search's steps wait for that may never come: one line per task queue on which a step has
    waited to start for WAIT_NOTICE_S or more while no worker polled it within LIVE_POLL (a queue that live workers
    poll only has them busy: its steps start in turn). Empty when Temporal cannot say (a `kf search show` must not
    fail for want of a note)."""
    now = datetime.now(UTC)
    waiting: dict[str, list[PendingActivityInfo]] = {}
    for step in description.raw_description.pending_activities:
        queue = step.activity_options.task_queue.name
        if step.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED or not queue:
            continue
        if (now - step.scheduled_time.ToDatetime(tzinfo=UTC)).total_seconds() >= WAIT_NOTICE_S:
            waiting.setdefault(queue, []).append(step)
    notes = []
    for queue, steps in sorted(waiting.items()):
        try:
            _, last = await queue_workers(client, queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        except RPCError:
            return []
        if last is not None and now - last <= LIVE_POLL:
            continue
        since = min(step.scheduled_time.ToDatetime(tzinfo=UTC) for step in steps)
        names = sorted({step.activity_type.name for step in steps})
        what = f"{len(steps)} steps ({', '.join(names)})" if len(steps) > 1 else names[0]
        seen = "no worker has polled it lately" if last is None else f"its last worker polled at {last:%H:%M:%S} UTC"
        limits = {step.activity_options.schedule_to_start_timeout.ToSeconds() for step in steps} - {0}
        deadline = since + timedelta(seconds=min(limits)) if limits else None
        fails = f"; without one the search fails at {deadline:%H:%M:%S} UTC" if deadline else ""
        notes.append(
            f"{what} on task queue {queue!r} waiting since {since:%H:%M:%S} UTC: {seen}{fails}; start `kf worker` on "
            "a machine with that hardware"
        )
    return notes


async def status_from_log(client: Client, database_url: str, search_id: str) -> SearchStatus | None:
    """The progress of a search that closed without its result (failed, terminated, timed out, canceled) as the
    event log tells it (engine/search/logged_status.py): what `kf search show` says when no worker is left to
    answer its query. None for a search that runs or completed (its query or result answers)."""
    description = await client.get_workflow_handle(search_id).describe()
    closed = _CLOSED.get(description.status)  # type: ignore[arg-type]
    if closed is None:
        return None
    history = await _logged_history(database_url, search_id)
    attributes = description.typed_search_attributes
    return logged_status(history, closed, problem=attributes.get(PROBLEM_ATTR), target=attributes.get(TARGET_ATTR))


async def _logged_history(database_url: str, search_id: str) -> SearchHistory:
    """The search's history as its event log tells it, through a store opened for the one read."""
    store = await EventStore.connect(database_url)
    try:
        return await load_search_history(store, search_id)
    finally:
        await store.close()


async def status_from_log_alone(database_url: str, search_id: str) -> SearchStatus | None:
    """The progress of a search Temporal does not hold (its history passed the namespace's retention, or it ran on
    another Temporal server), as the event log tells it: how it ended from its ``search.finished`` event, else
    ``unknown``. None when the log holds no event of it either."""
    history = await _logged_history(database_url, search_id)
    if not history.events:
        return None
    ended = history.finished.payload.get("status") if history.finished is not None else None
    return logged_status(history, str(ended or "unknown"), problem=None, target=None)


async def queried_status(client: Client, search_id: str) -> SearchStatus:
    """The `status` query's answer, waiting longer for a worker that polls the search's queue but is busy."""
    handle = client.get_workflow_handle(search_id)
    started = time.monotonic()
    try:
        return await handle.query("status", result_type=SearchStatus, rpc_timeout=STATUS_QUERY_TIMEOUT)
    except Exception as error:
        waited = time.monotonic() - started
        failure: BaseException = error
        if connection_broke(error) and waited >= STATUS_QUERY_TIMEOUT.total_seconds() * DEADLINE_REACHED:
            # The stream broke when the deadline came ("h2 protocol error" where "Timeout expired" is usual; seen
            # on CI with no worker): the query ran out its deadline, Temporal did not stop answering.
            failure = RPCError(
                f"Timeout expired: the query waited {waited:.0f}s and its connection broke at the deadline ({error})",
                RPCStatusCode.DEADLINE_EXCEEDED,
                b"",
            )
        if not query_timed_out(failure) or not await worker_polled_lately(client, handle):
            if failure is error:
                raise
            raise failure from error
    return await handle.query("status", result_type=SearchStatus, rpc_timeout=BUSY_WORKER_QUERY_TIMEOUT)


async def worker_polled_lately(client: Client, handle: WorkflowHandle[Any, Any]) -> bool:
    """True when a worker polled the search's queue within POLLED_LATELY: a worker that is gone stopped polling
    before the query was sent, one that is busy keeps polling. False when Temporal cannot say (the connection a
    timed-out query leaves behind can refuse the next call once: "h2 protocol error")."""
    try:
        polled = await last_poll(client, (await handle.describe()).task_queue)
    except RPCError:
        return False
    return polled is not None and datetime.now(UTC) - polled <= POLLED_LATELY


async def last_poll(client: Client, task_queue: str) -> datetime | None:
    """When a worker last polled ``task_queue`` for workflow tasks, by Temporal's poller list (its clock); None
    when it lists none."""
    _, last = await queue_workers(client, task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    return last


QUEUE_DESCRIBE_TIMEOUT = timedelta(seconds=5)
"""How long `kf status` waits for Temporal to list a queue's pollers: a local server answers in milliseconds."""


async def queue_workers(
    client: Client, task_queue: str, kind: TaskQueueType.ValueType
) -> tuple[list[str], datetime | None]:
    """The identities of the workers that polled ``task_queue`` lately for tasks of ``kind``, and when one last did
    (Temporal's poller list, on its clock: it forgets a poller some minutes after its last poll)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=task_queue), task_queue_type=kind
    )
    response = await client.workflow_service.describe_task_queue(request, timeout=QUEUE_DESCRIBE_TIMEOUT)
    identities = sorted({poller.identity for poller in response.pollers})
    last = max((p.last_access_time.ToDatetime(tzinfo=UTC) for p in response.pollers), default=None)
    return identities, last


async def send_update(client: Client, search_id: str, name: str, arg: Any = None) -> SearchStatus:
    """Run one of the search's updates (pause, resume, stop, add_hint, extend_budget) and return its status."""
    handle = client.get_workflow_handle(search_id)
    if arg is None:
        return await handle.execute_update(name, result_type=SearchStatus)
    return await handle.execute_update(name, arg, result_type=SearchStatus)


async def search_result(client: Client, search_id: str) -> SearchResult:
    """Wait for a search to finish and return its result."""
    return await client.get_workflow_handle(search_id, result_type=SearchResult).result()


async def list_searches(client: Client, limit: int = 50) -> list[dict[str, Any]]:
    """Recent searches with their progress attributes, newest first."""
    rows = []
    async for execution in client.list_workflows("WorkflowType = 'KernelSearch'", limit=limit):
        attrs = execution.typed_search_attributes
        rows.append(
            {
                "search_id": execution.id,
                "status": execution.status.name.lower() if execution.status else "unknown",
                "problem": attrs.get(PROBLEM_ATTR),
                "target": attrs.get(TARGET_ATTR),
                "generation": attrs.get(GENERATION_ATTR),
                "best_speedup": attrs.get(BEST_SPEEDUP_ATTR),
                "started": execution.start_time.isoformat() if execution.start_time else None,
                "from_log": False,
            }
        )
    return rows


LOG_LIST_TIMEOUT_S = 5.0
"""How long `kf search list` waits for the event log to list the searches Temporal does not: the list is Temporal's
first, and a database that does not answer must not hold it up."""


async def logged_searches(database_url: str, limit: int, listed: set[str]) -> list[dict[str, Any]]:
    """The newest searches the event log holds that are not in ``listed`` (Temporal's list: ones it no longer holds,
    after its retention or on another Temporal server), as list_searches' rows, newest first: how each ended from its
    ``search.finished`` event (``unknown`` without one), and ``from_log`` True."""
    store = await EventStore.connect(database_url, min_size=1, max_size=1)
    try:
        rows = await store.pool.fetch(
            "SELECT s.stream_id, s.payload->'spec' AS spec, s.recorded_at, f.payload AS finished "
            "FROM events s LEFT JOIN events f ON f.stream_id = s.stream_id AND f.type = 'search.finished' "
            "WHERE s.type = 'search.started' ORDER BY s.position DESC LIMIT $1",
            limit + len(listed),
        )
    finally:
        await store.close()
    found = []
    for row in rows:
        search_id = str(row["stream_id"]).removeprefix(stream_of(""))
        if search_id in listed:
            continue
        # The store's connections decode jsonb into Python objects (engine/evidence/store.py).
        spec: dict[str, Any] = row["spec"] or {}
        finished: dict[str, Any] = row["finished"] or {}
        run = finished.get("generations_run")
        found.append(
            {
                "search_id": search_id,
                "status": str(finished.get("status") or "unknown"),
                "problem": spec.get("problem"),
                "target": spec.get("target"),
                "generation": max(int(run) - 1, 0) if isinstance(run, int) else None,
                "best_speedup": finished.get("best_speedup"),
                "started": row["recorded_at"].isoformat(),
                "from_log": True,
            }
        )
    return found[:limit]


async def held_by_temporal(client: Client, search_ids: list[str]) -> set[str]:
    """Which of ``search_ids`` Temporal still holds: one visibility query for the ids its query language can quote,
    a description for any other."""
    plain = [i for i in search_ids if re.fullmatch(r"[A-Za-z0-9_.:@ -]+", i)]
    held: set[str] = set()
    if plain:
        quoted = ", ".join(f"'{i}'" for i in plain)
        query = f"WorkflowType = 'KernelSearch' AND WorkflowId IN ({quoted})"
        held |= {execution.id async for execution in client.list_workflows(query)}
    for search_id in (i for i in search_ids if i not in plain):
        try:
            await client.get_workflow_handle(search_id).describe()
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            continue
        held.add(search_id)
    return held


async def how_it_ended(client: Client, search_id: str) -> str | None:
    """How Temporal says the search ``search_id`` ended, for people: its status, and a failed one's reason
    (``failed: <message>``); ``running`` while it runs; None when Temporal holds no such search."""
    try:
        status = (await client.get_workflow_handle(search_id).describe()).status
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    if status is None or status == WorkflowExecutionStatus.RUNNING:
        return "running"
    return await why_it_ended(client, search_id, _CLOSED.get(status, status.name.lower()))


async def why_it_ended(client: Client, search_id: str, closed: str) -> str:
    """How a closed search ended (``closed``: one of CLOSED_WITHOUT_RESULT, or ``completed``) for people, with the
    reason a failed or terminated one gave (``terminated: <reason>``)."""
    reason: str | None = None
    if closed == "terminated":
        reason = await _termination_reason(client, search_id)
    if closed == "failed":
        try:
            await client.get_workflow_handle(search_id).result(follow_runs=False)
        except WorkflowFailureError as error:
            reason = str(getattr(error.cause, "message", None) or error.cause or error)
    return f"{closed}: {' '.join(reason.split())}" if reason else closed


async def _termination_reason(client: Client, search_id: str) -> str | None:
    """The reason given when the search ``search_id`` was terminated (the Web UI's or `temporal workflow terminate
    --reason`), from the last event of its history: one event read, however long the history."""
    response = await client.workflow_service.get_workflow_execution_history_reverse(
        GetWorkflowExecutionHistoryReverseRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=search_id), maximum_page_size=1
        )
    )
    for event in response.history.events:
        if event.HasField("workflow_execution_terminated_event_attributes"):
            return event.workflow_execution_terminated_event_attributes.reason or None
    return None
