"""``kf report ID`` and ``kf report --compare ID1 ID2``: a search's evidence as one self-contained HTML page.

The report reads the event log only (Postgres), never Temporal: it works while a search runs and after its
workflow history is gone. Exit status (cli/__init__.py): 0 written; 2 bad input (no such search, a malformed
URL, an --output whose place cannot hold a file); 3 the event log's database is not running or does not answer, or
the file could not be written once its place was checked (a full disk).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from typing import Any

from cli.options import search_id
from cli.output_file import checked_output, is_stream, written_whole
from engine.connections import database_url
from engine.errors import InfrastructureError, UserError
from engine.report.gather import gather_report
from engine.report.page import comparison_page, search_page
from engine.report.plots import PALETTE


def register(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "report",
        help="a search's evidence as one self-contained HTML page (plots, candidates, roofline, lessons)",
        description=(
            "Write one HTML file, viewable offline (no script, font or stylesheet fetched), with: speedup by "
            "evaluation with intervals and the incumbent's line; every candidate with its verdict, settings or "
            "source diff against its parent, proposer, rationale and lineage; each shape's time as a fraction of "
            "the machine's roofline; and the lessons the search started with and added. Read from the event log "
            "alone, so it works while a search runs and after Temporal has forgotten it."
        ),
    )
    command.add_argument("search_id", type=search_id, nargs="?", help="the search, as `kf search list` prints it")
    command.add_argument(
        "--compare",
        type=search_id,
        nargs="+",
        metavar="ID",
        default=None,
        help=f"overlay 2 to {len(PALETTE)} searches on one speedup-by-evaluation plot, e.g. a cold and a warm one "
        "(default: the one search ID names)",
    )
    command.add_argument(
        "--output",
        "-o",
        default=None,
        help="the HTML file to write (default: report-<ID>.html in the current folder; - writes to stdout)",
    )
    command.add_argument("--database-url", default=None, help="Postgres URL (default: KF_DATABASE_URL or `kf up`)")
    command.add_argument("--json", action="store_true", help='print {"path": ..., "search_ids": [...], "bytes": N}')
    command.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    ids = _search_ids(args)
    output = args.output or default_output(ids)
    # The place is checked before the database is read: a report that cannot be written is not rendered first.
    path = None if output == "-" else checked_output("--output", output, default_output(ids))
    # A database that is not running or does not answer raises ServiceUnavailable (or an outage mid-read):
    # cli.main says so in one line and exits 3.
    page = asyncio.run(render(args.database_url or database_url(), ids))
    if path is None:
        sys.stdout.write(page)
        return 0
    try:
        if is_stream(path):  # /dev/stdout, a named pipe: written into as it stands
            path.write_text(page, encoding="utf-8")
        else:
            with written_whole(path) as file:
                file.write(page.encode("utf-8"))
    except OSError as error:  # the place took a file a moment ago: a full disk, a file system gone read-only
        raise InfrastructureError(f"cannot write the report to {output!r}: {error.strerror or error}") from None
    if args.json:
        print(json.dumps({"path": str(path), "search_ids": ids, "bytes": len(page.encode("utf-8"))}))
    else:
        print(path)
    return 0


async def render(url: str, ids: list[str]) -> str:
    """The page: one search's full report, or the comparison of several."""
    if len(ids) == 1:
        return search_page(await gather_report(url, ids[0]))
    # One search at a time: each opens its own small pool, and the lessons are not part of a comparison.
    return comparison_page([await gather_report(url, i, with_lessons=False) for i in ids])


def default_output(ids: list[str]) -> str:
    """``report-<ID>.html`` (``report-<ID1>-vs-<ID2>.html`` for a comparison), safe as a file name whatever
    the ids hold."""
    return "report-" + "-vs-".join(_file_safe(i) for i in ids) + ".html"


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]


def _search_ids(args: argparse.Namespace) -> list[str]:
    if args.compare is not None:
        if args.search_id is not None:
            raise UserError(
                f"kf report takes one search id, or --compare with several, not both (got {args.search_id!r} and "
                f"--compare {' '.join(args.compare)})"
            )
        if not 2 <= len(args.compare) <= len(PALETTE):
            raise UserError(
                f"--compare takes 2 to {len(PALETTE)} search ids, got {len(args.compare)}: "
                "e.g. kf report --compare search-a search-b"
            )
        return list(args.compare)
    if args.search_id is None:
        raise UserError("kf report needs a search id (`kf search list` shows them), or --compare ID1 ID2")
    return [args.search_id]
