"""What an evidence export holds: its records, their one exact text, and the digest that seals them.

An export is a sequence of records, the same in every file format::

    header   ExportHeader   what was exported, when, and what the log held then (counts, positions, heads)
    event    ExportedEvent  one per event, in position order, with every field its hash covers
    end      ExportEnd      how many events came before it and the digest of everything before it

In JSON Lines (``.jsonl``) each record is one line, written as :func:`canonical_line` gives it. In Parquet the
events are the rows and the header and end records are the file's key-value metadata (``kf_export`` and
``kf_export_end``), in the same canonical text; the digest is computed over the same lines in both formats.

What protects what:

- each event's hash (recomputed from its fields by engine/evidence/event_hash.py) and the per-stream chain
  show a changed, removed or reordered event, exactly as the online audit does;
- the header's counts and stream heads, and the end record, show a cut or an extended file;
- the digest shows any other change to the file (the header's export time, spacing in a line).

Neither the digest nor the heads are a signature: whoever can rewrite the file can recompute both. What
vouches for the content against a deliberate rewrite is a head kept elsewhere: compare the header's stream
head with the one the search's Temporal history recorded (`kf audit SEARCH_ID` shows it).
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict

from engine.evidence.events import StreamHead

FORMAT_VERSION = 1
"""Version of the export's layout; a reader refuses versions it does not know."""

HEADER_KIND: Final = "kf-evidence-export"
"""``kind`` of the header record; also the text that marks a file as an export."""
EVENT_KIND: Final = "event"
"""``kind`` of an event record."""
END_KIND: Final = "kf-evidence-export-end"
"""``kind`` of the end record."""

PARQUET_HEADER_KEY = b"kf_export"
"""Parquet key-value metadata key holding the header record's canonical text."""
PARQUET_END_KEY = b"kf_export_end"
"""Parquet key-value metadata key holding the end record's canonical text."""

_RECORD = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class ExportHeader(BaseModel):
    """The first record: what the export holds and what the log held when it was taken."""

    model_config = _RECORD

    kind: Literal["kf-evidence-export"] = HEADER_KIND
    """Marks the record (and the file) as a Kernel Factory evidence export."""
    format_version: int = FORMAT_VERSION
    """Layout version of the export (FORMAT_VERSION when written)."""
    exported_at: AwareDatetime
    """When the export was taken (timezone-aware)."""
    search_id: str | None
    """The search whose stream was exported; None when the export holds the whole log."""
    events: int
    """How many event records follow."""
    first_position: int
    """Global position of the first event exported; 0 when there is none."""
    last_position: int
    """Global position of the last event exported; 0 when there is none."""
    log_committed: int
    """Highest position ever committed to the log when the export was taken: for a whole-log export, the
    last event exported must be there, or the log's newest events were already gone."""
    streams: list[StreamHead]
    """Each exported stream's head (its newest event's version, id and hash), sorted by stream id."""


class ExportedEvent(BaseModel):
    """One event of the log, with every field its hash covers, exactly as the database stored them."""

    model_config = _RECORD

    kind: Literal["event"] = EVENT_KIND
    """Marks an event record."""
    position: int
    """Global position in the log."""
    event_id: str
    """The writer's idempotency key."""
    stream_id: str
    """The stream the event belongs to."""
    stream_version: int
    """1-based version within the stream."""
    type: str
    """Registered type name."""
    schema_version: int
    """Version of the payload schema the writer used."""
    payload: str
    """The payload's jsonb text exactly as Postgres prints it (``payload::text``): the text the hash covers.
    Read it with ``json.loads`` (jq: ``.payload | fromjson``)."""
    metadata: str
    """The metadata's jsonb text exactly as Postgres prints it, likewise."""
    recorded_at: AwareDatetime
    """When the database appended it (timezone-aware, microsecond precision)."""
    prev_hash: str
    """Hash of the previous event of the stream; 64 zeros for version 1."""
    hash: str
    """The hash the database computed and stored for this event."""


class ExportEnd(BaseModel):
    """The last record: proof that the file was not cut short, and the digest of everything before it."""

    model_config = _RECORD

    kind: Literal["kf-evidence-export-end"] = END_KIND
    """Marks the end record."""
    events: int
    """How many event records came before it."""
    digest: str
    """sha-256 (hex) over the canonical lines of the header and of every event record, in order."""


ExportRecord = ExportHeader | ExportedEvent | ExportEnd


def canonical_line(record: ExportRecord) -> bytes:
    """The one text of a record: compact JSON in field order, UTF-8, ending in a newline. An export's JSON
    Lines file is exactly these lines, and the digest is computed over them in every format."""
    return record.model_dump_json().encode("utf-8") + b"\n"


class ExportDigest:
    """The running digest an end record seals: sha-256 over the header's line and every event's line."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, line: bytes) -> None:
        """Add one record's line (with its newline) as it stands in the file."""
        self._sha.update(line)

    def hexdigest(self) -> str:
        """The digest so far, in hex."""
        return self._sha.hexdigest()
