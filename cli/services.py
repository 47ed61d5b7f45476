"""``kf up``, ``kf down``, ``kf status``: the embedded Temporal and Postgres of the state folder."""

from __future__ import annotations

import argparse
import json

from engine import services
from engine.services import ServicesStatus, ServiceState, elsewhere

# `kf status` exit status when a server does not run, so scripts can test `kf status || kf up`.
EXIT_NOT_RUNNING = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    commands = [
        ("up", up, "start the embedded Temporal dev server and Postgres (if not running) and apply migrations"),
        ("down", down, "stop the embedded servers; their data is kept"),
        ("status", status, f"show what runs (exit status 0 when both do, {EXIT_NOT_RUNNING} otherwise)"),
    ]
    for name, handler, summary in commands:
        parser = subparsers.add_parser(name, help=summary, description=summary)
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
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
    _print(report, args.json)
    return 0 if report.all_running else EXIT_NOT_RUNNING


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
    for home in report.elsewhere:
        # `kf` run in another folder than `kf up` was: the state folder is relative to where it runs.
        print(f"Elsewhere: the embedded servers of {home} run; {elsewhere.fix_for(home)} to use them")
