"""Domain events: what a writer appends (NewEvent), what the log gives back (RecordedEvent, and the
StreamHead it leaves), and a registry of typed payloads.

A payload model declares its type name once::

    @event_type("candidate.compiled")
    class CandidateCompiled(EventPayload):
        candidate_id: str  # (real models give every field a docstring)

    await store.append(stream, [to_new_event(event_id, CandidateCompiled(candidate_id=...), metadata)])
    payload = decode(recorded)   # CandidateCompiled, or RawEvent if this code does not know the type

Reading never fails on an event this code cannot interpret (a type from a newer version, a payload an
old model rejects): it comes back as a RawEvent, so one odd event never stops an audit or a projection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

GENESIS_HASH = "0" * 64
"""prev_hash of the first event of every stream."""


class NewEvent(BaseModel):
    """An event a writer asks the store to append."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    event_id: str
    """Idempotency key, unique in the whole log: derive it from what the event records (search,
    generation, candidate hash, step) so that a retried writer sends the same id."""
    type: str
    """Registered type name, e.g. ``candidate.compiled``."""
    payload: dict[str, Any]
    """The fact, as JSON-compatible data (at most 1 MiB of JSON; bulk content goes content-addressed)."""
    metadata: dict[str, Any] = {}
    """Who wrote it (workflow id, run id, activity id, attempt, worker, hardware, code version). Not part
    of the idempotency comparison: a retry from another attempt is the same event."""
    schema_version: int = 1
    """Version of the payload schema of this type."""


class RecordedEvent(BaseModel):
    """An event as stored in the log, with the position and hash the database gave it."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    position: int
    """Global position, 1, 2, 3, ... in commit order, without gaps."""
    event_id: str
    """The writer's idempotency key."""
    stream_id: str
    """The stream the event belongs to."""
    stream_version: int
    """1-based version within the stream, contiguous."""
    type: str
    """Type name; :func:`decode` turns it into a payload model."""
    schema_version: int
    """Version of the payload schema the writer used."""
    payload: dict[str, Any]
    """The fact."""
    metadata: dict[str, Any]
    """Who wrote it."""
    recorded_at: datetime
    """When the database appended it (timezone-aware)."""
    prev_hash: str
    """Hash of the previous event of the stream; 64 zeros for version 1."""
    hash: str
    """sha-256 (hex) computed by the database over the event's canonical text and prev_hash."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RecordedEvent:
        """Build from a database row whose columns carry the field names (see RECORDED_COLUMNS).

        Why not ``model_validate``: the row comes from the log's own table, whose column types and
        constraints already guarantee every field, and building events is most of the client's cost of
        reading the log (validating would copy each payload and halve read throughput). This does what
        ``model_construct`` does, minus its per-field default and alias handling, which these fields
        do not use; tests/test_event_store.py checks the result equals the validated model."""
        event = cls.__new__(cls)
        _set_attribute(event, "__dict__", {name: row[name] for name in _RECORDED_FIELD_NAMES})
        _set_attribute(event, "__pydantic_fields_set__", set(_RECORDED_FIELDS))
        _set_attribute(event, "__pydantic_extra__", None)
        _set_attribute(event, "__pydantic_private__", None)
        return event


_set_attribute = object.__setattr__  # bypasses the frozen model's __setattr__, as model_construct does
_RECORDED_FIELD_NAMES = tuple(RecordedEvent.model_fields)
_RECORDED_FIELDS = frozenset(_RECORDED_FIELD_NAMES)


class StreamHead(BaseModel):
    """Where a stream stood after an append: its newest event's version, id and hash.

    The hash chain makes one head vouch for the whole stream up to it: changing, removing or re-hashing any
    earlier event changes the hash at this version. Kept outside the database (a search's Temporal history
    records one per step), a head is the witness that the database's owner cannot quietly rewrite."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    stream_id: str
    """The stream."""
    version: int
    """Version of its newest event at the time."""
    event_id: str
    """That event's id."""
    hash: str
    """That event's hash, which covers every earlier event of the stream through prev_hash."""

    @classmethod
    def of(cls, event: RecordedEvent) -> StreamHead:
        """The head a stream has when ``event`` is its newest event."""
        return cls(stream_id=event.stream_id, version=event.stream_version, event_id=event.event_id, hash=event.hash)


RECORDED_COLUMNS = ", ".join(RecordedEvent.model_fields)
"""SQL select list of the events table that :meth:`RecordedEvent.from_row` reads (columns carry the
field names)."""


class EventPayload(BaseModel):
    """Base of typed payloads. Subclasses register their type name with :func:`event_type`."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    event_type: ClassVar[str] = ""
    """Type name stored with the event; set by :func:`event_type`."""
    schema_version: ClassVar[int] = 1
    """Current schema version of this payload; set by :func:`event_type`."""

    @classmethod
    def upcast(cls, payload: dict[str, Any], from_version: int) -> dict[str, Any]:
        """Turn a payload written with an older ``from_version`` of the schema into the current shape.
        Override when a new schema version changes fields; the default keeps the payload as it is."""
        return payload


class RawEvent(BaseModel):
    """An event this code cannot interpret as a typed payload; kept whole so nothing is lost."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    type: str
    """The stored type name."""
    schema_version: int
    """The stored schema version."""
    payload: dict[str, Any]
    """The stored payload, untouched."""
    reason: str
    """Why it was not decoded: an unknown type, a newer schema, or the model's validation error."""


PayloadModel = TypeVar("PayloadModel", bound=type[EventPayload])

_registry: dict[str, type[EventPayload]] = {}


def event_type(name: str, *, schema_version: int = 1) -> Callable[[PayloadModel], PayloadModel]:
    """Class decorator: register a payload model under the type name ``name``."""
    if not name or name != name.strip():
        raise ValueError(f"event type name {name!r} must be non-empty without surrounding spaces")
    if schema_version < 1:
        raise ValueError(f"schema_version of event type {name!r} must be >= 1, got {schema_version}")

    def register(model: PayloadModel) -> PayloadModel:
        if not (isinstance(model, type) and issubclass(model, EventPayload)):
            raise TypeError(f"@event_type({name!r}) decorates EventPayload subclasses, not {model!r}")
        known = _registry.get(name)
        # The same class registered again (a module imported twice, e.g. by a test runner) is fine.
        if known is not None and _qualified(known) != _qualified(model):
            raise ValueError(f"event type {name!r} is already registered by {_qualified(known)}")
        model.event_type = name
        model.schema_version = schema_version
        _registry[name] = model
        return model

    return register


def _qualified(model: type) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def registered_types() -> dict[str, type[EventPayload]]:
    """Every registered type name with its payload model."""
    return dict(_registry)


def to_new_event(event_id: str, payload: EventPayload, metadata: Mapping[str, Any] | None = None) -> NewEvent:
    """The NewEvent that records ``payload`` (a registered model) under ``event_id``."""
    model = type(payload)
    if not model.event_type or _registry.get(model.event_type) is not model:
        raise TypeError(f"{_qualified(model)} is not registered: decorate it with @event_type('...')")
    return NewEvent(
        event_id=event_id,
        type=model.event_type,
        payload=payload.model_dump(mode="json"),
        metadata=dict(metadata or {}),
        schema_version=model.schema_version,
    )


def decode(recorded: RecordedEvent) -> EventPayload | RawEvent:
    """The typed payload of a stored event, or a RawEvent saying why it could not be typed. Never raises
    for the event's content."""

    def raw(reason: str) -> RawEvent:
        return RawEvent(
            type=recorded.type,
            schema_version=recorded.schema_version,
            payload=recorded.payload,
            reason=reason,
        )

    model = _registry.get(recorded.type)
    if model is None:
        return raw(f"unknown event type {recorded.type!r}")
    if recorded.schema_version > model.schema_version:
        return raw(
            f"schema version {recorded.schema_version} of {recorded.type!r} is newer than this code's "
            f"{model.schema_version}"
        )
    try:
        payload = recorded.payload
        if recorded.schema_version < model.schema_version:
            payload = model.upcast(dict(payload), recorded.schema_version)
        return model.model_validate(payload)
    except (ValidationError, ValueError, TypeError, KeyError) as error:
        return raw(f"payload does not fit {_qualified(model)}: {error}")
