"""How an evidence export is verified offline: no database, no Temporal, only the file (`kf audit --file`).

The checks are the online audit's (EventStore.verify), run on the file's records: every event's hash is
recomputed from its fields (engine/evidence/event_hash.py, the twin of the database's kf_event_hash), each
stream's chain links and versions are followed, positions must grow (and, for a whole-log export, run from 1
without a gap up to the highest position the log had committed). Then the file itself: its header's counts,
positions and stream heads must match the events, the end record must be there and count them, and the digest
it holds must be the digest of every line before it (engine/evidence/export_format.py says what each protects).

Every finding names the check that failed, the record's line and, for an event, its stream, version and position.

Outcomes: an ExportAudit, ``intact`` or not; a file that is not an export at all (missing, a directory, empty,
an unknown format, a Parquet file without the export's metadata) is a UserError saying what to pass instead.
A damaged export (a line that no longer parses, a record cut in half) is broken evidence, not bad input: it is
a finding, and the audit goes on with the next record.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError

from engine.errors import UserError
from engine.evidence.event_hash import event_hash
from engine.evidence.events import GENESIS_HASH, StreamHead
from engine.evidence.export_format import (
    END_KIND,
    FORMAT_VERSION,
    HEADER_KIND,
    ExportDigest,
    ExportedEvent,
    ExportEnd,
    ExportHeader,
    canonical_line,
)
from engine.evidence.store import EventRef

MAX_FINDINGS = 100
"""Findings an audit lists; the rest are only counted (a damaged file can fail on every line)."""

PARQUET_MAGIC = b"PAR1"
"""First (and last) four bytes of every Parquet file."""
EXPORT_MARKER = HEADER_KIND.encode()
"""Text found in an export's header (its first line) and end record (its last line), in every format."""
_PROBE_BYTES = 65536
"""How much of a file's start and end is read to tell what it is."""
_COMPRESSED = {
    b"\x1f\x8b": ("gzip", "gunzip"),
    b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"),
    b"BZh": ("bzip2", "bunzip2"),
    b"\xfd7zXZ\x00": ("xz", "unxz"),
    b"PK\x03\x04": ("zip", "unzip"),
}

Check = Literal[
    "malformed",
    "altered_text",
    "hash_mismatch",
    "chain_broken",
    "version_gap",
    "position_order",
    "position_gap",
    "duplicate_event",
    "header",
    "end",
    "digest",
    "trailing_data",
]


class ExportFinding(BaseModel):
    """One check that failed, and where."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    check: Check
    """malformed: a record that is not JSON, or not a record of this format (a missing or unknown field, a
    wrong type); altered_text: a record that reads the same but is not the exact text `kf export` wrote;
    hash_mismatch: the event's fields no longer hash to its hash (it was changed); chain_broken: its prev_hash
    is not the hash of its stream's previous event (one was changed, removed or reordered); version_gap: the
    stream's versions do not run 1, 2, 3…; position_order: positions do not grow; position_gap: a whole-log
    export skips positions, or stops short of the highest one committed; duplicate_event: an event id appears
    twice; header: it is missing or misplaced, or its counts, positions or heads differ from the events; end:
    the end record is missing (the file was cut), misplaced or counts other events; digest: the end record's
    digest is not that of the records before it; trailing_data: something follows the end record."""
    line: int | None
    """The record's number in export order: 1 the header, then the events, then the end record (the line of a
    JSON Lines file; the same numbering for Parquet, whose rows are the events). None for the file as a whole."""
    event: EventRef | None
    """The event the check failed on, when the record names one."""
    expected: str | None = None
    """What the check computed or expected."""
    actual: str | None = None
    """What the file holds."""
    message: str
    """The finding in words."""

    def __str__(self) -> str:
        where = [f"line {self.line}"] if self.line is not None else []
        if self.event is not None:
            where.append(str(self.event))
        prefix = f"{', '.join(where)}: " if where else ""
        detail = f" (expected {self.expected}, found {self.actual})" if self.expected is not None else ""
        return f"{prefix}{self.check.replace('_', ' ')}: {self.message}{detail}"


class ExportAudit(BaseModel):
    """What the offline audit of an export found."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    file: str
    """The file audited."""
    format: Literal["jsonl", "parquet"]
    """Its format, told by its first bytes."""
    header: ExportHeader | None
    """Its header, when one could be read."""
    end: ExportEnd | None
    """Its end record, when one could be read."""
    events: int
    """Event records read."""
    hashes_checked: int
    """Event hashes recomputed."""
    streams: list[StreamHead]
    """The head each stream has in the file: its last event read, sorted by stream id."""
    findings: list[ExportFinding]
    """The first MAX_FINDINGS findings, in file order."""
    findings_total: int
    """Every finding, listed or not."""
    intact: bool
    """No finding: every hash, link, version, position, count, head and the digest check out."""


def audit_export(path: Path | str) -> ExportAudit:
    """Verify the export at ``path`` without a database. Raises UserError when it is not an export at all."""
    path = Path(path)
    head, tail = _probe(path)
    if head.startswith(PARQUET_MAGIC):
        return _audit_parquet(path, tail)
    if EXPORT_MARKER in head[:4096] or EXPORT_MARKER in tail[-4096:]:
        return _audit_jsonl(path)
    for magic, (name, tool) in _COMPRESSED.items():
        if head.startswith(magic):
            raise UserError(
                f"--file {path} is {name}-compressed; decompress it first ({tool} {path}) and audit the result"
            )
    raise UserError(
        f"--file {path} is not a kf evidence export: it is neither Parquet nor JSON Lines with an export header "
        f"(it starts with {head[:24]!r}); pass a file written by `kf export`"
    )


def _probe(path: Path) -> tuple[bytes, bytes]:
    """The first and last bytes of the file, or a UserError saying why it cannot be read."""
    if not path.exists():
        raise UserError(f"--file {path}: no such file; pass the file `kf export --output FILE` wrote")
    if not path.is_file():
        raise UserError(f"--file {path} is not a regular file; pass the export file itself")
    try:
        with path.open("rb") as file:
            head = file.read(_PROBE_BYTES)
            size = file.seek(0, 2)
            file.seek(max(0, size - _PROBE_BYTES))
            tail = file.read()
    except OSError as error:
        raise UserError(f"--file {path} cannot be read ({error.strerror or error}); check its permissions") from None
    if not head:
        raise UserError(f"--file {path} is empty, not an export (which holds at least a header and an end record)")
    return head, tail


class _Verifier:
    """The checks, fed one record at a time in file order. It keeps each stream's last event and every event id,
    never the events themselves."""

    def __init__(self) -> None:
        self.findings: list[ExportFinding] = []
        self.total = 0
        self.header: ExportHeader | None = None
        self.end: ExportEnd | None = None
        self.end_line: int | None = None
        self.digest = ExportDigest()
        self.digest_computable = True
        """False once a record could not be read: its canonical line, and so the digest, are unknown."""
        self.header_streams: set[str] = set()
        self.heads: dict[str, ExportedEvent] = {}
        self.event_ids: set[str] = set()
        self.events = 0
        self.hashes = 0
        self.first_position: int | None = None
        self.previous_position: int | None = None

    def find(
        self,
        check: Check,
        line: int | None,
        message: str,
        *,
        event: ExportedEvent | EventRef | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        self.total += 1
        if len(self.findings) >= MAX_FINDINGS:
            return
        ref = _ref(event) if isinstance(event, ExportedEvent) else event
        self.findings.append(
            ExportFinding(
                check=check,
                line=line,
                event=ref,
                expected=None if expected is None else str(expected),
                actual=None if actual is None else str(actual),
                message=message,
            )
        )

    # -- records ---------------------------------------------------------------------------------------

    def on_header(self, line: int, header: ExportHeader) -> None:
        if line != 1 or self.header is not None:
            self.find("header", line, "a header record after the first line: records were moved or joined")
            return
        self.header = header
        self.header_streams = {head.stream_id for head in header.streams}
        if header.format_version != FORMAT_VERSION:
            self.find(
                "header",
                line,
                f"format version {header.format_version} is not one this kf reads: a newer kf wrote it, or the "
                "header was changed",
                expected=FORMAT_VERSION,
                actual=header.format_version,
            )

    def on_event(self, line: int, event: ExportedEvent) -> None:
        self.events += 1
        if self.header is not None and self.header.search_id is not None:
            if event.stream_id not in self.header_streams:
                self.find(
                    "header",
                    line,
                    f"stream {event.stream_id!r} is not among the streams the header says were exported",
                    event=event,
                )
        recomputed = event_hash(
            prev_hash=event.prev_hash,
            position=event.position,
            event_id=event.event_id,
            stream_id=event.stream_id,
            stream_version=event.stream_version,
            type=event.type,
            schema_version=event.schema_version,
            recorded_at=event.recorded_at,
            payload_text=event.payload,
            metadata_text=event.metadata,
        )
        self.hashes += 1
        if recomputed != event.hash:
            self.find(
                "hash_mismatch",
                line,
                "the event's fields no longer hash to its hash: it was changed",
                event=event,
                expected=recomputed,
                actual=event.hash,
            )
        previous = self.heads.get(event.stream_id)
        expected_prev = previous.hash if previous is not None else GENESIS_HASH
        if event.prev_hash != expected_prev:
            self.find(
                "chain_broken",
                line,
                "prev_hash is not the hash of the stream's previous event in the export (one was changed, removed "
                "or moved)"
                if previous is not None
                else "the stream's first event in the export does not start its chain (its earlier events are "
                "missing, or prev_hash was changed)",
                event=event,
                expected=expected_prev,
                actual=event.prev_hash,
            )
        expected_version = previous.stream_version + 1 if previous is not None else 1
        if event.stream_version != expected_version:
            self.find(
                "version_gap",
                line,
                "stream versions do not follow on (events removed, added or moved)",
                event=event,
                expected=expected_version,
                actual=event.stream_version,
            )
        whole_log = self.header is not None and self.header.search_id is None
        if self.previous_position is not None and event.position <= self.previous_position:
            self.find(
                "position_order",
                line,
                f"position after {self.previous_position}: the export is in position order, so events were moved",
                event=event,
                expected=f"> {self.previous_position}",
                actual=event.position,
            )
        elif whole_log and event.position != (self.previous_position or 0) + 1:
            self.find(
                "position_gap",
                line,
                "a whole-log export holds every position from 1: events before this one are missing",
                event=event,
                expected=(self.previous_position or 0) + 1,
                actual=event.position,
            )
        if event.event_id in self.event_ids:
            self.find("duplicate_event", line, "this event id appears earlier in the export", event=event)
        self.event_ids.add(event.event_id)
        self.heads[event.stream_id] = event
        if self.first_position is None:
            self.first_position = event.position
        self.previous_position = max(event.position, self.previous_position or 0)

    def on_end(self, line: int, end: ExportEnd) -> None:
        if self.end is not None:
            self.find("trailing_data", line, "a second end record")
            return
        self.end, self.end_line = end, line

    def on_malformed(self, line: int | None, why: str, raw: bytes | None = None) -> None:
        """A record that could not be read; ``raw`` its text when the digest covers that text (JSON Lines)."""
        if raw is None:
            self.digest_computable = False
        self.find("malformed", line, why, event=_guess_event(raw) if raw is not None else None)

    # -- the file as a whole ---------------------------------------------------------------------------

    def finish(self) -> None:
        header, end = self.header, self.end
        if header is None:
            self.find("header", 1, "no header record: the file's first line was removed or damaged")
        else:
            self._check_header(header)
        if end is None:
            self.find(
                "end",
                None,
                f"no end record after {self.events} events: the file was cut short (or its last line damaged)",
            )
            return
        if end.events != self.events:
            self.find(
                "end", self.end_line, "the end record counts other events", expected=self.events, actual=end.events
            )
        if self.digest_computable and self.digest.hexdigest() != end.digest:
            self.find(
                "digest",
                self.end_line,
                "the records before the end record are not the ones it sealed: the file was edited",
                expected=self.digest.hexdigest(),
                actual=end.digest,
            )

    def _check_header(self, header: ExportHeader) -> None:
        counts = (
            ("events", header.events, self.events),
            ("first_position", header.first_position, self.first_position or 0),
            ("last_position", header.last_position, self.previous_position or 0),
        )
        for name, said, found in counts:
            if said != found:
                self.find("header", 1, f"the header's {name} differs from the events'", expected=found, actual=said)
        said_heads = {head.stream_id: head for head in header.streams}
        for stream_id in sorted(said_heads.keys() | self.heads.keys()):
            said_head, last = said_heads.get(stream_id), self.heads.get(stream_id)
            found_head = _head(last) if last is not None else None
            if said_head == found_head:
                continue
            if found_head is None:
                message = f"the header lists stream {stream_id!r}, of which the export holds no event"
            elif said_head is None:
                message = f"stream {stream_id!r} is not among the header's streams"
            else:
                message = f"stream {stream_id!r} ends elsewhere than the header's head says (events removed or added)"
            self.find(
                "header",
                1,
                message,
                event=_ref(last) if last is not None else None,
                expected=_head_text(found_head),
                actual=_head_text(said_head),
            )
        if header.search_id is None and header.last_position != header.log_committed:
            self.find(
                "position_gap",
                1,
                f"the log had committed up to position {header.log_committed} but its events end at "
                f"{header.last_position}: its newest events were already gone when the export was taken",
                expected=header.log_committed,
                actual=header.last_position,
            )

    def report(self, path: Path, kind: Literal["jsonl", "parquet"]) -> ExportAudit:
        heads = [_head(event) for _, event in sorted(self.heads.items())]
        return ExportAudit(
            file=str(path),
            format=kind,
            header=self.header,
            end=self.end,
            events=self.events,
            hashes_checked=self.hashes,
            streams=heads,
            findings=self.findings,
            findings_total=self.total,
            intact=self.total == 0,
        )


# -- JSON Lines -----------------------------------------------------------------------------------------


def _audit_jsonl(path: Path) -> ExportAudit:
    verifier = _Verifier()
    line = 0
    with path.open("rb") as file:
        for raw in file:
            line += 1
            if verifier.end is not None:
                verifier.find("trailing_data", line, f"{len(raw)} bytes after the end record: something was appended")
                continue
            record = _parse_line(verifier, line, raw)
            if record is None:
                verifier.digest.add(raw)
                continue
            if raw != canonical_line(record):
                verifier.find(
                    "altered_text",
                    line,
                    "the record reads the same but its text is not the one `kf export` wrote (spacing, escapes, "
                    "key order or a missing newline)",
                    event=record if isinstance(record, ExportedEvent) else None,
                )
            if isinstance(record, ExportHeader):
                verifier.on_header(line, record)
            elif isinstance(record, ExportedEvent):
                verifier.on_event(line, record)
            else:
                verifier.on_end(line, record)
            if not isinstance(record, ExportEnd):
                verifier.digest.add(raw)
    verifier.finish()
    return verifier.report(path, "jsonl")


def _parse_line(verifier: _Verifier, line: int, raw: bytes) -> ExportHeader | ExportedEvent | ExportEnd | None:
    """The record on a line, or None after reporting why it is not one. The digest is still computable: the
    raw line is what it covers."""
    try:
        # pydantic-core's parser, not json's: it refuses lone surrogates ("\ud801"), which no Postgres text holds
        # and no canonical line can be written with (json.loads accepts them).
        value = pydantic_core.from_json(raw)
    except ValueError as error:
        verifier.on_malformed(line, f"not a JSON record ({error})", raw)
        return None
    return _validate(verifier, line, value, raw)


def _validate(
    verifier: _Verifier, line: int, value: Any, raw: bytes | None
) -> ExportHeader | ExportedEvent | ExportEnd | None:
    if not isinstance(value, dict):
        verifier.on_malformed(line, f"a JSON {type(value).__name__}, not a record", raw)
        return None
    kind = value.get("kind")
    model: type[ExportHeader] | type[ExportedEvent] | type[ExportEnd]
    model = ExportHeader if kind == HEADER_KIND else ExportEnd if kind == END_KIND else ExportedEvent
    try:
        return model.model_validate(value)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'record'}: {item['msg']}" for item in error.errors()[:3]
        )
        verifier.on_malformed(line, f"not a valid {model.__name__} ({problems})", raw)
        return None


_GUESS = {
    "position": re.compile(rb'"position":(\d+)'),
    "event_id": re.compile(rb'"event_id":"((?:[^"\\]|\\.)*)"'),
    "stream_id": re.compile(rb'"stream_id":"((?:[^"\\]|\\.)*)"'),
    "stream_version": re.compile(rb'"stream_version":(\d+)'),
}


def _guess_event(raw: bytes) -> EventRef | None:
    """The event a damaged line most likely held, read from what is left of its fields; None if unsure."""
    found: dict[str, Any] = {}
    for name, pattern in _GUESS.items():
        match = pattern.search(raw)
        if match is None:
            return None
        text = match.group(1).decode("utf-8", "replace")
        found[name] = int(text) if name in ("position", "stream_version") else text
    return EventRef(**found)


# -- Parquet ----------------------------------------------------------------------------------------------


def _audit_parquet(path: Path, tail: bytes) -> ExportAudit:
    # pyarrow is slow to import: only a Parquet file pays for it.
    from engine.evidence.export_parquet import SCHEMA, open_parquet_export

    verifier = _Verifier()
    try:
        export = open_parquet_export(path)
    except Exception as error:  # pyarrow raises several types (ArrowInvalid, OSError) for a damaged file
        if EXPORT_MARKER not in tail:
            raise UserError(
                f"--file {path} starts like Parquet but cannot be read as Parquet ({error}), and it is not a kf "
                "evidence export; pass a file written by `kf export`"
            ) from None
        verifier.on_malformed(None, f"the Parquet file cannot be read: {error}")
        verifier.finish()
        return verifier.report(path, "parquet")
    try:
        if export.header is None and export.end is None:
            raise UserError(
                f"--file {path} is a Parquet file but not a kf evidence export (it has no kf_export metadata); "
                "pass a file written by `kf export --format parquet`"
            )
        if export.columns != SCHEMA.names:
            verifier.find(
                "malformed",
                None,
                "the event columns are not the export's",
                expected=",".join(SCHEMA.names),
                actual=",".join(export.columns),
            )
        if export.header is not None:
            record = _parse_metadata(verifier, 1, export.header)
            if isinstance(record, ExportHeader):
                verifier.on_header(1, record)
            elif record is not None:
                verifier.find("header", 1, "the kf_export metadata holds another kind of record")
            verifier.digest.add(export.header + b"\n")
        line = 1
        try:
            for row in export.rows():
                line += 1
                event = _validate(verifier, line, {"kind": "event", **row}, None)
                if isinstance(event, ExportedEvent):
                    verifier.on_event(line, event)
                    verifier.digest.add(canonical_line(event))
        except Exception as error:  # a damaged page or column chunk
            verifier.on_malformed(line + 1, f"the Parquet rows cannot be read past here: {error}")
        if export.end is not None:
            record = _parse_metadata(verifier, line + 1, export.end)
            if isinstance(record, ExportEnd):
                verifier.on_end(line + 1, record)
            elif record is not None:
                verifier.find("end", line + 1, "the kf_export_end metadata holds another kind of record")
    finally:
        export.close()
    verifier.finish()
    return verifier.report(path, "parquet")


def _parse_metadata(verifier: _Verifier, line: int, raw: bytes) -> ExportHeader | ExportedEvent | ExportEnd | None:
    record = _parse_line(verifier, line, raw)
    if record is not None and raw + b"\n" != canonical_line(record):
        verifier.find("altered_text", line, "the record reads the same but its text is not the one `kf export` wrote")
    return record


# -- helpers ------------------------------------------------------------------------------------------------


def _ref(event: ExportedEvent) -> EventRef:
    return EventRef(
        position=event.position, event_id=event.event_id, stream_id=event.stream_id, stream_version=event.stream_version
    )


def _head(event: ExportedEvent) -> StreamHead:
    """The head a stream has when ``event`` is its last event in the export."""
    return StreamHead(stream_id=event.stream_id, version=event.stream_version, event_id=event.event_id, hash=event.hash)


def _head_text(head: StreamHead | None) -> str:
    return "none" if head is None else f"v{head.version} {head.event_id!r} {head.hash}"


def format_export_audit(report: ExportAudit) -> str:
    """The offline audit for people."""
    header = report.header
    if header is None:
        scope = "unknown scope (no header)"
    elif header.search_id is None:
        scope = f"the whole log, exported {header.exported_at.isoformat()}"
    else:
        scope = f"search {header.search_id}, exported {header.exported_at.isoformat()}"
    streams = len(report.streams)
    lines = [
        f"export {report.file} ({report.format}): {scope}",
        f"  {report.events} events in {streams} stream{'s' if streams != 1 else ''}, "
        f"{report.hashes_checked} hashes recomputed offline",
    ]
    if report.intact:
        lines.append("  hash chains: intact; versions contiguous; positions in order")
        lines.append("  header and end record: match the events (counts, positions, heads, digest)")
        for head in report.streams:
            lines.append(f"  head {head.stream_id} v{head.version} {head.hash}")
        if header is not None and header.search_id is not None:
            lines.append(
                f"  compare the head with the witness in the search's Temporal history: kf audit {header.search_id}"
            )
        lines.append("INTACT")
        return "\n".join(lines)
    lines.append(f"BROKEN: {report.findings_total} finding{'s' if report.findings_total != 1 else ''}")
    lines += [f"  - {finding}" for finding in report.findings]
    if report.findings_total > len(report.findings):
        lines.append(f"  … and {report.findings_total - len(report.findings)} more")
    return "\n".join(lines)
