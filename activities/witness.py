"""A search's witness: the stream heads its Temporal history recorded, read through a Temporal client.

KernelSearch keeps its stream's head in every step's result, in the state it carries across
continue-as-new and in its result (workflows/kernel_search.py). This module walks the search's runs from the
newest back to the first and collects them; engine/search/witness.py compares them with the event log.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from temporalio.api.common.v1 import Payloads
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from engine.evidence.events import StreamHead
from engine.search.witness import Witness, WitnessedHead


async def witness_of(client: Client, search_id: str) -> Witness:
    """The heads that the search's Temporal history recorded; unavailable (with the reason) when the
    history is gone or Temporal does not answer. Never raises for either."""
    heads: list[WitnessedHead] = []
    final: WitnessedHead | None = None
    runs: list[str] = []
    run_id: str | None = None  # None: the newest run
    missing_earlier = ""
    while True:
        try:
            history = await client.get_workflow_handle(search_id, run_id=run_id).fetch_history()
        except RPCError as error:
            if runs and error.status == RPCStatusCode.NOT_FOUND:
                # Retention deletes each run's history on its own; the newest run's carried state still
                # holds the head the earlier runs reached.
                missing_earlier = f"; the history of earlier run {run_id} is gone (retention)"
                break
            return Witness(
                search_id=search_id,
                available=False,
                reason=_unavailable(client, search_id, error),
                transient=error.status != RPCStatusCode.NOT_FOUND,
            )
        if not history.events:
            break
        run = history.run_id
        runs.append(run)
        found, completed, previous_run = await _heads_of_run(client, history, run)
        heads[:0] = found  # older runs first
        if final is None and len(runs) == 1:
            final = completed
        if not previous_run:
            break
        run_id = previous_run
    source = f"Temporal history of {search_id} in namespace {client.namespace}: {len(runs)} run(s)"
    return Witness(
        search_id=search_id,
        available=True,
        source=source,
        heads=heads,
        final=final,
        reason=missing_earlier.lstrip("; "),
    )


async def _heads_of_run(
    client: Client, history: WorkflowHistory, run: str
) -> tuple[list[WitnessedHead], WitnessedHead | None, str]:
    """(heads recorded in this run, the head of its completed result or None, the run it continued from)."""
    heads: list[WitnessedHead] = []
    final: WitnessedHead | None = None
    previous_run = ""
    activity_types: dict[int, str] = {}
    for event in history.events:
        where = f"run {run[:8]}, history event {event.event_id}"
        if event.HasField("workflow_execution_started_event_attributes"):
            started = event.workflow_execution_started_event_attributes
            previous_run = started.continued_execution_run_id
            head = _head_in(await _decode(client, started.input))
            if head is not None:
                heads.append(WitnessedHead(head=head, source=f"state carried by continue-as-new ({where})"))
        elif event.HasField("activity_task_scheduled_event_attributes"):
            activity_types[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.HasField("activity_task_completed_event_attributes"):
            completed = event.activity_task_completed_event_attributes
            head = _head_in(await _decode(client, completed.result))
            if head is not None:
                name = activity_types.get(completed.scheduled_event_id, "?")
                heads.append(WitnessedHead(head=head, source=f"activity {name} ({where})"))
        elif event.HasField("workflow_execution_completed_event_attributes"):
            head = _head_in(await _decode(client, event.workflow_execution_completed_event_attributes.result))
            if head is not None:
                final = WitnessedHead(head=head, source=f"the search's result ({where})")
    return heads, final, previous_run


async def _decode(client: Client, payloads: Payloads) -> Any:
    """The first value of ``payloads`` as plain JSON data (dicts, lists), or None."""
    if not payloads.payloads:
        return None
    try:
        values = await client.data_converter.decode(list(payloads.payloads))
    except Exception:  # a payload this converter cannot read holds no head of ours
        return None
    return values[0] if values else None


def _head_in(value: Any) -> StreamHead | None:
    """The stream head in a recorded value: a head itself (kf.record), a step's output or the search's
    result (its ``head``), or the state carried by continue-as-new (``state.head``)."""
    if not isinstance(value, dict):
        return None
    state = value.get("state")
    for candidate in (value, value.get("head"), state.get("head") if isinstance(state, dict) else None):
        if isinstance(candidate, dict):
            try:
                return StreamHead.model_validate(candidate)
            except ValidationError:
                continue
    return None


def _unavailable(client: Client, search_id: str, error: RPCError) -> str:
    if error.status == RPCStatusCode.NOT_FOUND:
        return (
            f"Temporal has no history of {search_id} in namespace {client.namespace}: deleted after the namespace's "
            "retention period, or the search ran on another cluster or namespace"
        )
    return f"Temporal did not answer for {search_id}: {error.message or error}"
