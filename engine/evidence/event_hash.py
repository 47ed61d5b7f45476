"""How an event's hash is computed, in Python: the twin of ``kf_event_hash`` in migrations/0001_event_store.sql.

The database is the authority: it hashes every event it stores, and the online audit (``EventStore.verify``)
recomputes those hashes in SQL. This module exists for the one place no database is at hand: an export
verified offline (``kf audit --file``). It builds, byte for byte, the text Postgres hashes::

    jsonb_build_array(prev_hash, position, event_id, stream_id, stream_version, type, schema_version,
                      extract(epoch FROM recorded_at), payload, metadata)::text

Why the payload and metadata come in as text, not as Python values: jsonb keeps a number's decimal text
(``2.50`` stays ``2.50``, ``1e-7`` becomes ``0.0000001``), which a Python float cannot carry, and events
written by other writers (psql, another service) may hold any numeric. The export carries each event's
jsonb text exactly as Postgres printed it (``payload::text``), and that text is what enters the hash; any
change to it changes the hash. tests/test_export.py checks this function against the database's own on
events with quotes, control characters, non-ASCII text, odd numbers and instants before 1970.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# jsonb's escape_json: these five by name, the other control characters as \u00xx (lower-case hex), and
# everything else (DEL, non-ASCII, '/') as it is.
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE_TABLE = str.maketrans({**{chr(c): f"\\u{c:04x}" for c in range(0x20)}, **_ESCAPES})


def json_text(value: str) -> str:
    """``value`` as a JSON string, exactly as Postgres prints a jsonb string."""
    return '"' + value.translate(_ESCAPE_TABLE) + '"'


def epoch_text(instant: datetime) -> str:
    """``extract(epoch FROM instant)`` as Postgres (14 and later) prints it: a numeric with six decimals."""
    if instant.tzinfo is None:
        raise ValueError(f"recorded_at {instant.isoformat()} has no time zone; the log records timezone-aware instants")
    delta = instant - _EPOCH
    # Integer arithmetic, never a float: microseconds are exact, and so is the text.
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    sign = "-" if micros < 0 else ""
    whole, fraction = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{fraction:06d}"


def canonical_text(
    *,
    prev_hash: str,
    position: int,
    event_id: str,
    stream_id: str,
    stream_version: int,
    type: str,
    schema_version: int,
    recorded_at: datetime,
    payload_text: str,
    metadata_text: str,
) -> str:
    """The text ``kf_event_hash`` hashes: a jsonb array of the event's fields, in its order and spacing.

    ``payload_text`` and ``metadata_text`` are the jsonb texts of the payload and metadata as Postgres
    prints them (``payload::text``)."""
    return (
        f"[{json_text(prev_hash)}, {position}, {json_text(event_id)}, {json_text(stream_id)}, {stream_version}, "
        f"{json_text(type)}, {schema_version}, {epoch_text(recorded_at)}, {payload_text}, {metadata_text}]"
    )


def event_hash(
    *,
    prev_hash: str,
    position: int,
    event_id: str,
    stream_id: str,
    stream_version: int,
    type: str,
    schema_version: int,
    recorded_at: datetime,
    payload_text: str,
    metadata_text: str,
) -> str:
    """sha-256 (hex) of :func:`canonical_text`: the hash the database stored for this event, if it is unchanged."""
    text = canonical_text(
        prev_hash=prev_hash,
        position=position,
        event_id=event_id,
        stream_id=stream_id,
        stream_version=stream_version,
        type=type,
        schema_version=schema_version,
        recorded_at=recorded_at,
        payload_text=payload_text,
        metadata_text=metadata_text,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
