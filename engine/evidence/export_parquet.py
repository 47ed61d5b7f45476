"""An evidence export as a Parquet file: the events are the rows, the header and end records its metadata.

One column per field of ExportedEvent (its ``kind`` is implied). The payload and metadata are string columns
holding their jsonb text, the exact text the hash covers (engine/evidence/event_hash.py), so a reader that
turns them into nested columns cannot change what is verified. The header and end records are the file's
key-value metadata ``kf_export`` and ``kf_export_end``, in their canonical text (export_format.canonical_line
without the newline), so the digest of a Parquet export is computed over the same lines as the JSON Lines one.

pyarrow is imported by this module only: the CLI loads it when a Parquet file is written or read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from engine.evidence.export_format import (
    PARQUET_END_KEY,
    PARQUET_HEADER_KEY,
    ExportedEvent,
    ExportEnd,
    ExportHeader,
    canonical_line,
)

SCHEMA = pa.schema(
    [
        ("position", pa.int64()),
        ("event_id", pa.string()),
        ("stream_id", pa.string()),
        ("stream_version", pa.int64()),
        ("type", pa.string()),
        ("schema_version", pa.int64()),
        ("payload", pa.string()),
        ("metadata", pa.string()),
        ("recorded_at", pa.timestamp("us", tz="UTC")),
        ("prev_hash", pa.string()),
        ("hash", pa.string()),
    ]
)
"""The event columns, in ExportedEvent's field order."""

READ_BATCH = 1000
"""Rows read from the file at a time."""


class ParquetSink:
    """Writes an export to a Parquet file (a path or a seekable binary stream)."""

    def __init__(self, out: str | Path | BinaryIO) -> None:
        self._out = out
        self._writer: pq.ParquetWriter | None = None
        self._header = b""

    def header(self, header: ExportHeader) -> None:
        self._header = canonical_line(header).rstrip(b"\n")
        self._writer = pq.ParquetWriter(self._out, SCHEMA)

    def events(self, events: Sequence[ExportedEvent]) -> None:
        assert self._writer is not None, "header() comes first"
        columns = {name: [getattr(event, name) for event in events] for name in SCHEMA.names}
        self._writer.write_table(pa.Table.from_pydict(columns, schema=SCHEMA))

    def end(self, end: ExportEnd) -> None:
        assert self._writer is not None, "header() comes first"
        self._writer.add_key_value_metadata(
            {PARQUET_HEADER_KEY: self._header, PARQUET_END_KEY: canonical_line(end).rstrip(b"\n")}
        )
        self._writer.close()


@dataclass(frozen=True)
class ParquetExport:
    """A Parquet file opened as an export: the raw text of its header and end records (None where absent)
    and its rows, to be checked by the offline audit."""

    header: bytes | None
    """The ``kf_export`` metadata value, as stored."""
    end: bytes | None
    """The ``kf_export_end`` metadata value, as stored."""
    columns: list[str]
    """The file's column names."""
    file: pq.ParquetFile
    """The open file, for :meth:`rows`."""

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every row as a dict of column name to Python value, in file order."""
        for batch in self.file.iter_batches(batch_size=READ_BATCH):
            yield from batch.to_pylist()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


def open_parquet_export(path: Path) -> ParquetExport:
    """Open ``path`` as Parquet; pyarrow's errors (a damaged or foreign file) propagate to the caller."""
    file = pq.ParquetFile(path)
    metadata = file.metadata.metadata or {}
    return ParquetExport(
        header=metadata.get(PARQUET_HEADER_KEY),
        end=metadata.get(PARQUET_END_KEY),
        columns=list(file.schema_arrow.names),
        file=file,
    )
