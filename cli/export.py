"""`kf export [SEARCH_ID | --all] --format jsonl|parquet [--output FILE]`: the evidence with its hash chain, for
anyone to verify offline with `kf audit --file FILE` (handled here too; `kf audit` is registered in cli/search.py).

Exit status: 0 written (or, for the audit, intact); 1 the export is broken; 2 bad input (no search id, a parquet
export to a terminal, a file that is not an export); 3 the database did not answer or failed mid-export.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from cli.options import search_id
from cli.output_file import checked_output, is_stream, written_whole
from engine.connections import database_url
from engine.database_url import check_database_url
from engine.errors import UserError
from engine.evidence.export import ExportSink, JsonlSink, export_evidence
from engine.evidence.export_format import ExportEnd
from engine.evidence.store import EventStore
from engine.outages import is_outage

FORMATS = ("jsonl", "parquet")


def register(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "export",
        help="write a search's evidence (or the whole log) with its hash chain, for offline audit",
        description=(
            "Write the events of a search's stream (or, with --all, of the whole log) with every field their hashes "
            "cover, between a header (scope, counts, stream heads) and an end record (count and digest), so that "
            "`kf audit --file FILE` can verify it without a database. JSON Lines go to standard output unless "
            "--output is given; Parquet needs --output or a redirected standard output."
        ),
    )
    command.add_argument("search_id", type=search_id, nargs="?", help="the search (omit with --all)")
    command.add_argument("--all", action="store_true", help="export the whole log instead of one search")
    command.add_argument("--format", choices=FORMATS, default="jsonl", help="file format (default jsonl)")
    command.add_argument("--output", "-o", default=None, help="the file to write (default: standard output)")
    command.add_argument("--database-url", default=None, help="Postgres URL (default: KF_DATABASE_URL or `kf up`)")
    command.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    if args.all == (args.search_id is not None):
        raise UserError("kf export takes a search id, or --all for the whole log (not both)")
    output = _output_path(args.output)
    if output is None and args.format == "parquet" and sys.stdout.isatty():
        raise UserError(
            "--format parquet writes binary data, which a terminal cannot show: pass --output FILE, or redirect "
            "standard output (kf export … --format parquet > FILE.parquet)"
        )
    url = check_database_url(args.database_url or database_url())
    try:
        end = _export(url, args.search_id, args.format, output)
    except BrokenPipeError:  # `kf export … | head`: the reader left; cli.main says so
        raise
    except Exception as error:
        if is_outage(error):  # the database did not answer, or stopped answering mid-export: the machine failed
            where = f"; nothing was written to {output}" if output else ""
            print(f"kf: error: {' '.join(str(error).split())}{where}", file=sys.stderr)
            return 3
        if isinstance(error, OSError):  # a full disk, a file system gone read-only
            print(f"kf: error: cannot write the export to {output or 'standard output'}: {error}", file=sys.stderr)
            return 3
        raise
    if output is not None:
        scope = f"search {args.search_id}" if args.search_id else "the whole log"
        print(
            f"exported {end.events} events of {scope} to {output} ({args.format}); verify: kf audit --file {output}",
            file=sys.stderr,
        )
    return 0


def _output_path(output: str | None) -> Path | None:
    """The --output file, checked before the database is contacted; None for standard output."""
    if output is None or output == "-":
        return None
    return checked_output("--output", output, "evidence.jsonl")


def _export(url: str, search: str | None, file_format: str, output: Path | None) -> ExportEnd:
    """Export to ``output`` (None: standard output). A file is written next to its place and renamed into it
    only when complete, so a failed export never leaves a file that looks like one, cut short."""
    if output is None or is_stream(output):
        # Standard output, /dev/stdout, a named pipe: written into as it stands (cli/output_file.py).
        with _stream(output) as stream:
            if file_format == "jsonl":
                # Streamed: a reader sees the events as they come; the end record tells it the export finished.
                return asyncio.run(_export_to(url, search, JsonlSink(stream)))
            with tempfile.TemporaryFile(prefix="kf-export-") as spool:  # Parquet: whole first, its footer comes last
                end = asyncio.run(_export_to(url, search, _sink(file_format, spool)))
                spool.seek(0)
                shutil.copyfileobj(spool, stream)
            stream.flush()
            return end
    with written_whole(output) as file:
        end = asyncio.run(_export_to(url, search, _sink(file_format, file)))
    return end


@contextlib.contextmanager
def _stream(output: Path | None) -> Iterator[BinaryIO]:
    """Standard output (left open), or ``output`` opened for writing."""
    if output is None:
        yield sys.stdout.buffer
        return
    with output.open("wb") as stream:
        yield stream


def _sink(file_format: str, file: BinaryIO) -> ExportSink:
    if file_format == "parquet":
        from engine.evidence.export_parquet import ParquetSink  # pyarrow: imported only when asked for

        return ParquetSink(file)
    return JsonlSink(file)


async def _export_to(url: str, search: str | None, sink: ExportSink) -> ExportEnd:
    store = await EventStore.connect(url, max_size=2)
    try:
        return await export_evidence(store, sink, search_id=search)
    finally:
        await store.close()


def run_offline_audit(args: argparse.Namespace) -> int:
    """`kf audit --file FILE [--json]`: verify an export without a database: 0 intact, 1 broken, 2 not an export."""
    from engine.evidence.offline_audit import audit_export, format_export_audit

    if args.all or args.search_id is not None:
        raise UserError(
            "kf audit --file verifies an export offline and takes no search id or --all: the export's header says "
            "what it holds"
        )
    report = audit_export(Path(args.file))
    print(json.dumps(report.model_dump(mode="json")) if args.json else format_export_audit(report))
    return 0 if report.intact else 1
