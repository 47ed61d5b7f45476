"""`kf schedule …`: searches that re-run on a schedule, each warm-started from the newest incumbent.

A schedule is a Temporal Schedule (activities/schedule_client.py), so the Web UI's *Schedules* page shows and
steers it too. What each run starts from is engine/search/schedules.py's to say.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cli.options import search_id
from cli.search import add_spec_options, spec_from_args, ui_url
from engine.config import temporal_namespace
from engine.errors import UserError
from engine.search.schedules import INTERVAL_FORM, parse_interval, scheduled_spec

if TYPE_CHECKING:
    from temporalio.client import Client

    from activities.schedule_client import ScheduleRow

SCHEDULE_ID_HELP = "the schedule id, as `kf schedule list` prints it"


def register(subparsers: Any) -> None:
    schedule = subparsers.add_parser("schedule", help="re-run a search on a schedule (Temporal Schedules)")
    verbs = schedule.add_subparsers(dest="verb", metavar="VERB")

    create = verbs.add_parser(
        "create",
        help="start a search of PROBLEM every interval",
        description="Create a Temporal Schedule that starts a KernelSearch every --every. Each run starts from the "
        "newest incumbent an earlier search of the problem on the target recorded (re-timed, as generation 0) and "
        "skips what that search evaluated; with --cold, from the seed kernel. Lessons and recorded evidence of "
        "every earlier search apply either way.",
    )
    create.add_argument("problem", help="built-in problem name or problem folder")
    create.add_argument("--every", required=True, type=_interval, help=f"how often a search starts: {INTERVAL_FORM}")
    # argparse reads `--every -1h` as an unknown option `-1h`, not as --every's value, and would refuse it without
    # saying what an interval is. This parser has no option that looks like a negative number, so a word such as
    # `-1h` may be a value here, and --every's own check refuses it with the allowed form.
    create._negative_number_matcher = re.compile(r"^-\d[\w.]*$")
    # Every run starts from the newest incumbent (or, with --cold, the seed): one fixed --resume-from makes no sense.
    add_spec_options(create, resume_from=False)
    create.add_argument(
        "--cold", action="store_true", help="start every run from the seed kernel, not the newest incumbent"
    )
    create.add_argument(
        "--id", type=search_id, default=None, help="the schedule id (default: schedule-<problem>-<random>)"
    )
    create.add_argument("--json", action="store_true", help="print the schedule as JSON")
    create.set_defaults(handler=run_create)

    listing = verbs.add_parser("list", help="the schedules of searches")
    listing.add_argument("--json", action="store_true", help="print a JSON list of the schedules")
    listing.set_defaults(handler=run_list)

    for verb, aliases, text in (
        ("pause", [], "start no more searches until unpaused (running ones go on)"),
        ("unpause", ["resume"], "start searches again at the schedule's times"),
        ("trigger", [], "start one search now (skipped while the schedule's last search still runs)"),
        ("delete", [], "delete the schedule (searches it started are kept)"),
    ):
        parser = verbs.add_parser(verb, aliases=aliases, help=text)
        parser.add_argument("schedule_id", type=search_id, help=SCHEDULE_ID_HELP)
        if verb in ("pause", "unpause"):
            parser.add_argument("--note", default=None, help="why, shown on the Schedules page (default: none)")
        parser.add_argument("--json", action="store_true", help="print the schedule as JSON")
        parser.set_defaults(handler=run_verb, action=verb)
    schedule.set_defaults(handler=lambda args: (schedule.print_help(), 2)[1])


def _interval(text: str) -> timedelta:
    try:
        return parse_interval(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def schedule_url(schedule_id: str) -> str:
    """The schedule's page in the Temporal Web UI."""
    return f"{ui_url()}/namespaces/{temporal_namespace()}/schedules/{schedule_id}"


def run_create(args: argparse.Namespace) -> int:
    try:
        spec = scheduled_spec(spec_from_args(args), warm=not args.cold)
    except ValueError as error:  # resume_from given in --spec
        raise UserError(f"--spec: {error}") from None

    async def go(client: Client) -> ScheduleRow:
        from activities.schedule_client import create_schedule, describe_schedule

        return await describe_schedule(client, await create_schedule(client, spec, args.every, args.id))

    row = _run(go)
    if args.json:
        print(json.dumps(row.model_dump(mode="json") | {"ui": schedule_url(row.schedule_id)}))
    else:
        print(
            f"created schedule {row.schedule_id}: {row.summary}\n"
            f"run one now: kf schedule trigger {row.schedule_id}\nUI: {schedule_url(row.schedule_id)}"
        )
    return 0


def run_list(args: argparse.Namespace) -> int:
    async def go(client: Client) -> list[ScheduleRow]:
        from activities.schedule_client import list_schedules

        return await list_schedules(client)

    rows = _run(go)
    if args.json:
        print(json.dumps([row.model_dump(mode="json") for row in rows]))
        return 0
    if not rows:
        print("no schedules yet: kf schedule create softmax --every 24h")
    for row in rows:
        print(format_row(row))
    return 0


def run_verb(args: argparse.Namespace) -> int:
    async def go(client: Client) -> ScheduleRow | None:
        from activities import schedule_client

        if args.action == "pause":
            return await schedule_client.pause_schedule(client, args.schedule_id, args.note)
        if args.action == "unpause":
            return await schedule_client.unpause_schedule(client, args.schedule_id, args.note)
        if args.action == "trigger":
            return await schedule_client.trigger_schedule(client, args.schedule_id)
        await schedule_client.delete_schedule(client, args.schedule_id)
        return None

    row = _run(go)
    if row is None:
        print(
            json.dumps({"schedule_id": args.schedule_id, "deleted": True})
            if args.json
            else f"deleted {args.schedule_id}"
        )
    elif args.json:
        print(json.dumps(row.model_dump(mode="json")))
    elif args.action == "trigger":
        print(f"triggered {row.schedule_id}: its searches are listed by `kf search list` ({run_prefix(row)}…)")
    else:
        print(format_row(row))
    return 0


def run_prefix(row: ScheduleRow) -> str:
    from activities.schedule_client import run_id_base

    return run_id_base(row.schedule_id)


def format_row(row: ScheduleRow) -> str:
    """One schedule on one line: id, state, interval, what it searches, runs so far and the next one."""
    state = "paused" if row.paused else "active"
    upcoming = f"next {row.next_run}" if row.next_run else "no next run"
    return (
        f"{row.schedule_id:<36} {state:<7} every {row.every or '-':<7} {row.problem or '-':<10} "
        f"{row.target or '-':<22} {row.runs} runs · last {row.last_search_id or '-'} · {upcoming}"
    )


def _run(work: Callable[[Client], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        from activities.temporal_client import INTERACTIVE_CONNECT_S, connect

        return await work(await connect(within_s=INTERACTIVE_CONNECT_S))

    return asyncio.run(go())
