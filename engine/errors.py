"""Errors Kernel Factory raises on purpose. Catch what you can handle::

KernelFactoryError            anything raised on purpose by this package
├── UserError                 bad input the user can fix; the message names the value and the fix
│   ├── ConfigurationError    bad URL, address, state folder or environment
│   │   └── ServiceUnavailable a server (Postgres, Temporal) that does not run or answer where it is expected
│   ├── ServiceError          an embedded server (kf up) that failed to start or stop; shows its log
│   ├── UnknownProblemError   a --problem that is neither built in nor a problem folder
│   ├── NoEvents              a search id the event log holds no event of
│   └── MigrationError        a missing, edited or failing migration
├── InfrastructureError       a server (Postgres, Temporal) stayed unreachable past the outage patience
├── EventStoreError           the event log refused an operation
│   ├── ConcurrencyError      a writer's expected stream version was not the stream's version
│   ├── IdempotencyConflict   an event id was reused with different content
│   ├── PayloadTooLarge       an event's payload exceeds the documented limit (also a UserError)
│   └── InvalidEvent          an event the log cannot store as given (also a UserError)
└── ArtifactStoreError        the shared artifact store refused an operation
    ├── ArtifactCorrupt       stored bytes no longer hash to the digest stored with them
    └── ArtifactConflict      an artifact id already stored as another kind of artifact
"""

from __future__ import annotations


class KernelFactoryError(Exception):
    """Base of every error Kernel Factory raises on purpose."""


class UserError(KernelFactoryError):
    """Bad input the user can fix. The message says what was wrong, with the value, and what to do."""


class ConfigurationError(UserError):
    """A malformed URL or address, an unusable state folder, a port already taken."""


class ServiceUnavailable(ConfigurationError):
    """A server (Postgres, Temporal) that does not run or does not answer where the configuration says it is:
    `kf up` not run, a server down or restarting, a network in between. The machine failed, not the input:
    `kf` exits 3 (cli/exit_status.py). A ConfigurationError still, because the fix may be the address."""


class ServiceError(UserError):
    """An embedded server that failed to start or stop. The message quotes the end of its log and its path."""


class UnknownProblemError(UserError):
    """A problem name that is not built in and not a path to a problem folder."""


class ProblemDefinitionError(UserError):
    """A problem folder's own code failed while a kernel was judged: a function of its problem.py raised, or
    returned something malformed (inputs, a reference, a tolerance, a roofline). Nothing any kernel did: no
    candidate can be judged until problem.py is fixed, so a search stops with the message."""

    def __init__(self, message: str, *, hung: bool = False) -> None:
        super().__init__(message)
        self.hung = hung
        """The function did not return within its deadline (KF_PROBLEM_CALL_S): calling it again waits as long."""


class NoEvents(UserError):
    """A search id the event log holds no event of: no such search, or one that ended (or is waiting) before its
    first step recorded anything -- which only Temporal can tell apart (the CLI asks it: cli/no_events.py)."""

    def __init__(self, search_id: str, message: str | None = None) -> None:
        super().__init__(message or f"no events for search {search_id!r}; `kf search list` shows the search ids")
        self.search_id = search_id
        """The search id asked about."""


class MigrationError(UserError):
    """A migration that is missing, was edited after it was applied, or failed."""


class InfrastructureError(KernelFactoryError):
    """A server the kernel has nothing to do with (Postgres, Temporal) stayed unreachable for longer than the
    outage patience (``KF_OUTAGE_PATIENCE_S``): an infrastructure failure, never a kernel's verdict."""


class EventStoreError(KernelFactoryError):
    """The event log refused an operation."""


class ConcurrencyError(EventStoreError):
    """A writer expected a stream version other than the stream's current one."""

    def __init__(self, message: str, *, stream_id: str = "", expected: int = -1, actual: int = -1) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual


class IdempotencyConflict(EventStoreError):
    """An event id was appended again with different content."""

    def __init__(self, message: str, *, event_id: str = "") -> None:
        super().__init__(message)
        self.event_id = event_id


class PayloadTooLarge(EventStoreError, UserError):
    """An event payload exceeds the store's documented limit; store the bulk content-addressed instead."""


class InvalidEvent(EventStoreError, UserError):
    """An event the log cannot store as given: a duplicate id within one batch, a payload that is not JSON."""


class ArtifactStoreError(KernelFactoryError):
    """The shared artifact store (engine/evidence/artifacts.py) refused an operation."""


class ArtifactCorrupt(ArtifactStoreError):
    """An artifact whose stored bytes no longer hash to the digest stored with them: the store's fault, never
    the kernel's; fetch it again, or build it again under its id elsewhere."""


class ArtifactConflict(ArtifactStoreError):
    """An artifact id put again as another kind: an id names one build, so one kind."""
