"""``kf up``, ``kf down``, ``kf status``: the embedded Temporal and Postgres of the state folder."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime

from cli.options import queue_prefix
from engine import services
from engine.errors import ConfigurationError, ServiceUnavailable
from engine.services import ServicesStatus, ServiceState, elsewhere
from engine.services.status import QueueWorkers

# `kf status` exit status when a server does not run, so scripts can test `kf status || kf up`.
EXIT_NOT_RUNNING = 3

WORKERS_TIMEOUT_S = 10.0
"""How long `kf status` waits for Temporal to list the workers before it says it could not: a server that runs
but hangs must not hang the command that is run to find out."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    commands = [
        ("up", up, "start the embedded Temporal dev server and Postgres (if not running) and apply migrations"),
        ("down", down, "stop the embedded servers; their data is kept"),
        ("status", status, f"show what runs (exit status 0 when both do, {EXIT_NOT_RUNNING} otherwise)"),
    ]
    for name, handler, summary in commands:
        parser = subparsers.add_parser(name, help=summary, description=summary)
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        if name == "status":
            parser.add_argument(
                "--prefix",
                type=queue_prefix,
                default="kf",
                help="list the workers of this task queue prefix, as `kf worker --prefix` and a search's name it "
                "(default: kf)",
            )
        parser.set_defaults(handler=handler)


def up(args: argparse.Namespace) -> int:
    report = services.up()
    _print(report, args.json)
    return 0


def down(args: argparse.Namespace) -> int:
    report = services.down()
    _print(report, args.json)
    return 0


def status(args: argparse.Namespace) -> int:
    report = services.status()
    if report.temporal.ok:
        # Who would run a search started now: not part of the exit status, which says whether the servers run.
        try:
            report.workers = asyncio.run(asyncio.wait_for(_queue_workers(args.prefix), WORKERS_TIMEOUT_S))
        except TimeoutError:
            report.workers_unknown = f"Temporal did not list the workers within {WORKERS_TIMEOUT_S:g} s"
        except (ServiceUnavailable, ConfigurationError, RuntimeError) as error:
            report.workers_unknown = f"Temporal did not list the workers: {error}"
    _print(report, args.json)
    return 0 if report.all_running else EXIT_NOT_RUNNING


async def _queue_workers(prefix: str) -> list[QueueWorkers]:
    """The pollers of the queues a search on this machine with ``prefix`` needs: the control queue's workflows, its
    targets' steps (the generic ``kf-cpu`` and the ISA's own) and the build queue's CUDA compiles."""
    # Imported here: the Temporal client and the worker's modules take half a second to import, which `kf up`,
    # `kf down` and a `kf status` with Temporal stopped need not pay.
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.service import RPCError

    from activities.search_client import queue_workers
    from activities.temporal_client import connect
    from activities.worker import serveable_targets
    from engine.search.spec import build_queue, control_queue, target_queue
    from engine.targets import cpu_target

    client = await connect()
    queues = [(control_queue(prefix), TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)]
    targets = [cpu_target().split("-", 1)[0], *serveable_targets()]
    for name in [*dict.fromkeys(target_queue(prefix, target) for target in targets), build_queue(prefix)]:
        queues.append((name, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
    found = []
    for name, kind in queues:
        try:
            pollers, last = await queue_workers(client, name, kind)
        except RPCError as error:
            raise ServiceUnavailable(f"{name}: {error}") from error
        found.append(
            QueueWorkers(
                task_queue=name,
                kind="workflow" if kind == TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW else "activity",
                pollers=pollers,
                last_poll=last,
            )
        )
    return found


def _print(report: ServicesStatus, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.model_dump(mode="json") | {"all_running": report.all_running}, indent=2))
        return
    for note in report.notes:
        print(note)
    if report.notes:
        print()
    print(f"State folder: {report.home}")
    for service in (report.temporal, report.postgres):
        print(f"{service.name.capitalize():<9} {service.describe()}")
        if service.ui_url:
            print(f"{'':<9} Web UI {service.ui_url}")
        if service.state is ServiceState.STOPPED and service.log and service.log.exists():
            print(f"{'':<9} log: {service.log}")
    if report.workers is not None:
        _print_workers(report.workers)
    elif report.workers_unknown:
        print(f"{'Workers':<9} unknown: {report.workers_unknown}")
    for home in report.elsewhere:
        # `kf` run in another folder than `kf up` was: the state folder is relative to where it runs.
        print(f"Elsewhere: the embedded servers of {home} run; {elsewhere.fix_for(home)} to use them")


def _print_workers(queues: list[QueueWorkers]) -> None:
    from activities.search_client import LIVE_POLL  # only once Temporal runs: the import costs half a second

    if not any(queue.pollers for queue in queues):
        prefix = queues[0].task_queue.removesuffix("-control")
        start = "kf worker" if prefix == "kf" else f"kf worker --prefix {prefix}"
        print(f"{'Workers':<9} none polls {queues[0].task_queue}: a search waits for one; start one with `{start}`")
        return
    now = datetime.now(UTC)
    width = max(len(queue.task_queue) for queue in queues)
    for index, queue in enumerate(queues):
        label = "Workers" if index == 0 else ""
        if not queue.pollers:
            print(f"{label:<9} {queue.task_queue:<{width}}  none")
            continue
        ago = ""
        if queue.last_poll is not None:
            seconds = max(0.0, (now - queue.last_poll).total_seconds())
            ago = f", last poll {seconds:.0f} s ago"
            if seconds > LIVE_POLL.total_seconds():
                ago += ": likely gone (a live worker polls at least once a minute; Temporal lists it for minutes)"
        print(f"{label:<9} {queue.task_queue:<{width}}  {len(queue.pollers)} ({', '.join(queue.pollers)}){ago}")
