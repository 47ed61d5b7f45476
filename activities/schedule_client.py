"""Search schedules on Temporal: what `kf schedule` (and tests) call on a client.

A schedule is a real Temporal Schedule, listed on the Web UI's *Schedules* page: its action starts a KernelSearch
on the spec's control queue, every run a workflow of its own (id ``search-<name>-<time>``), warm-started from the
newest incumbent (engine/search/schedules.py). The schedule's policy skips a run that comes due while the last is
still searching, and drops runs missed by more than one interval (Temporal down, the schedule paused): the next
on-time run covers them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.search_client import SEARCH_TIMEOUT, new_search_id, search_attributes, search_input
from engine.errors import UserError
from engine.search.console import static_details, summary
from engine.search.schedules import interval_text
from engine.search.spec import SearchSpec, control_queue
from workflows.kernel_search import PROBLEM_ATTR, TARGET_ATTR


class ScheduleRow(BaseModel):
    """One schedule of searches, as `kf schedule list` shows it."""

    schedule_id: str
    """The Temporal schedule id."""
    problem: str | None
    """The problem its searches work on."""
    target: str | None
    """The target they search on."""
    every: str | None
    """How often a search starts (`1d`, `1h30m`)."""
    paused: bool
    """True while the schedule starts nothing."""
    note: str | None
    """The schedule's note: who created or paused it, and why."""
    summary: str | None
    """The one-line summary each run carries (engine/search/console.py)."""
    runs: int
    """Searches it has started."""
    last_search_id: str | None
    """The newest search it started."""
    next_run: str | None
    """When the next search starts (ISO 8601, UTC)."""


def new_schedule_id(spec: SearchSpec) -> str:
    """A readable, unique schedule id: `schedule-softmax-3f9c1a2b`."""
    return "schedule-" + new_search_id(spec).removeprefix("search-")


def run_id_base(schedule_id: str) -> str:
    """The workflow id of the schedule's runs, to which Temporal appends each run's time."""
    return "search-" + schedule_id.removeprefix("schedule-")


async def create_schedule(client: Client, spec: SearchSpec, every: timedelta, schedule_id: str | None = None) -> str:
    """Create a schedule that starts a search with ``spec`` every ``every``; return its id. ``spec`` is the
    scheduled one (engine/search/schedules.py: `scheduled_spec`), so each run's start is decided by the spec."""
    schedule_id = schedule_id or new_schedule_id(spec)
    text = interval_text(every)
    action = ScheduleActionStartWorkflow(
        "KernelSearch",
        search_input(spec),
        id=run_id_base(schedule_id),
        task_queue=control_queue(spec.task_queue_prefix),
        typed_search_attributes=search_attributes(spec),
        execution_timeout=SEARCH_TIMEOUT,
        static_summary=summary(spec, every=text),
        static_details=static_details(spec, schedule_id),
    )
    schedule = Schedule(
        action=action,
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=every),
        state=ScheduleState(note=f"kf schedule create {spec.problem} --every {text}"),
    )
    try:
        # The schedule carries the problem and target too, so the Schedules page can be filtered by them.
        await client.create_schedule(schedule_id, schedule, search_attributes=search_attributes(spec))
    except ScheduleAlreadyRunningError:
        raise UserError(
            f"schedule {schedule_id!r} exists already; pick another --id, or `kf schedule delete` it"
        ) from None
    return schedule_id


async def list_schedules(client: Client) -> list[ScheduleRow]:
    """Every schedule that starts KernelSearch, with its state described afresh (the list itself is Temporal's
    visibility view: a schedule just created or deleted may take a moment to show there)."""
    rows = []
    async for entry in await client.list_schedules():
        workflow = getattr(entry.schedule.action, "workflow", None) if entry.schedule else None
        if workflow != "KernelSearch":
            continue
        try:
            rows.append(await describe_schedule(client, entry.id))
        except UserError:
            continue  # deleted since the list was made
    return sorted(rows, key=lambda row: row.schedule_id)


async def describe_schedule(client: Client, schedule_id: str) -> ScheduleRow:
    """One schedule's row, described by Temporal now."""
    description = await _existing(client.get_schedule_handle(schedule_id), ScheduleHandle.describe)
    action = description.schedule.action
    spec_fields = await _action_input(client, action)
    intervals = description.schedule.spec.intervals
    recent = description.info.recent_actions
    last = recent[-1].action if recent else None
    upcoming = description.info.next_action_times
    attrs = description.typed_search_attributes
    return ScheduleRow(
        schedule_id=schedule_id,
        problem=attrs.get(PROBLEM_ATTR) or spec_fields.get("problem"),
        target=attrs.get(TARGET_ATTR) or spec_fields.get("target", "cpu"),
        every=interval_text(intervals[0].every) if intervals else None,
        paused=description.schedule.state.paused,
        note=description.schedule.state.note,
        summary=await _summary(client, action),
        runs=description.info.num_actions,
        last_search_id=last.workflow_id if isinstance(last, ScheduleActionExecutionStartWorkflow) else None,
        next_run=upcoming[0].isoformat() if upcoming and not description.schedule.state.paused else None,
    )


async def pause_schedule(client: Client, schedule_id: str, note: str | None = None) -> ScheduleRow:
    """Stop starting searches (those running go on); return the schedule's row."""
    handle = client.get_schedule_handle(schedule_id)
    await _existing(handle, lambda h: h.pause(note=note or "paused by kf schedule pause"))
    return await describe_schedule(client, schedule_id)


async def unpause_schedule(client: Client, schedule_id: str, note: str | None = None) -> ScheduleRow:
    """Start searches again at the schedule's next time; return its row."""
    handle = client.get_schedule_handle(schedule_id)
    await _existing(handle, lambda h: h.unpause(note=note or "unpaused by kf schedule unpause"))
    return await describe_schedule(client, schedule_id)


async def trigger_schedule(client: Client, schedule_id: str) -> ScheduleRow:
    """Start one search now, as if the schedule's time had come (skipped if its last search still runs)."""
    await _existing(client.get_schedule_handle(schedule_id), ScheduleHandle.trigger)
    return await describe_schedule(client, schedule_id)


async def delete_schedule(client: Client, schedule_id: str) -> None:
    """Delete the schedule; searches it started are not touched."""
    await _existing(client.get_schedule_handle(schedule_id), ScheduleHandle.delete)


async def _existing(handle: ScheduleHandle, call: Any) -> Any:
    """``call(handle)``, with Temporal's "not found" said as a UserError naming the schedule."""
    try:
        return await call(handle)
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            raise UserError(f"no schedule {handle.id!r}; `kf schedule list` shows the schedules") from None
        raise


async def _action_input(client: Client, action: Any) -> dict[str, Any]:
    """The search spec (as the plain dict the UI would send) a schedule's action starts its searches with."""
    args = getattr(action, "args", None) or []
    if args and isinstance(args[0], Payload):
        args = await client.data_converter.decode(list(args))
    first = args[0] if args else None
    return first if isinstance(first, dict) else {}


async def _summary(client: Client, action: Any) -> str | None:
    """A schedule action's static summary: text when given here, a payload when described by Temporal."""
    value = getattr(action, "static_summary", None)
    if isinstance(value, Payload):
        decoded = (await client.data_converter.decode([value]))[0]
        return decoded if isinstance(decoded, str) else None
    return value if isinstance(value, str) else None
