"""Connecting to Temporal the one way Kernel Factory does: pydantic payloads, the configured namespace."""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode

from engine.config import temporal_namespace
from engine.connections import temporal_address
from engine.errors import ConfigurationError, InfrastructureError, ServiceUnavailable
from engine.outages import causes, is_outage

_UNREACHABLE = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.RESOURCE_EXHAUSTED)
"""Status codes of a frontend that did not answer the call: down, too slow, or refusing it for load (its rate
limits, ``frontend.namespaceRPS`` and the like, or a full persistence queue): each passes with time."""
_CONNECTION_FAILURES = ("transport error", "h2 protocol error")
"""What the client's message says when the connection failed rather than the server answered."""


INTERACTIVE_CONNECT_S = 10.0
"""How long a `kf` command waits for Temporal to accept its client (``connect(within_s=...)``). The client's own wait,
for a frontend that accepts connections and answers nothing (a stopped process, a host out of memory), is about
30 s: `kf search list` took 31 s to say Temporal was unreachable. A frontend that answers does so in well under a
second, and `kf up` returns only once it answers. Workers wait the client's own time (they retry anyway)."""


async def connect(
    address: str | None = None,
    namespace: str | None = None,
    runtime: Runtime | None = None,
    *,
    within_s: float | None = None,
) -> Client:
    """A client for ``address`` (default: KF_TEMPORAL_ADDRESS or the embedded dev server). ``runtime``: the SDK
    runtime its workers report metrics through (activities/metrics.py); default the SDK's own, without metrics.
    ``within_s``: how long to wait for the frontend to answer (None: the client's own wait)."""
    target = address or temporal_address()
    connecting = Client.connect(
        target,
        namespace=namespace or temporal_namespace(),
        data_converter=pydantic_data_converter,
        runtime=runtime or _quiet_runtime(),
    )
    fix = "run `kf up` for the embedded server, or set KF_TEMPORAL_ADDRESS to a running frontend"
    try:
        return await (connecting if within_s is None else asyncio.wait_for(connecting, within_s))
    except TimeoutError:
        if within_s is None:  # the client's own timeout, not this wait: said as the client says it
            raise
        raise ServiceUnavailable(
            f"cannot reach Temporal at {target}: it accepted connections but did not answer within {within_s:g} s "
            f"(a stopped or overloaded server); {fix}"
        ) from None
    except RuntimeError as error:
        # Nothing answered (refused, timed out): the machine's failure, `kf` exits 3. Anything else the server
        # said (an unknown namespace, say) is the configuration's.
        kind = ServiceUnavailable if unreachable(error) else ConfigurationError
        raise kind(f"cannot reach Temporal at {target}: {error}; {fix}") from error


_RUNTIME: list[Runtime] = []


def _quiet_runtime() -> Runtime:
    """The SDK runtime of a client made without one: its core's log lines (a gRPC call retried while the frontend
    is down, say) go to Python's logging, so to standard error, never to standard output, which a `kf` command
    keeps for its answer (the SDK's default runtime prints them to the console). One per process, made on first
    use."""
    if not _RUNTIME:
        forwarding = LogForwardingConfig(logger=logging.getLogger("temporalio.core"))
        logs = LoggingConfig(filter=TelemetryFilter(core_level="WARN", other_level="ERROR"), forwarding=forwarding)
        _RUNTIME.append(Runtime(telemetry=TelemetryConfig(logging=logs)))
    return _RUNTIME[0]


def unreachable(error: BaseException) -> bool:
    """True when ``error`` (or one it was raised from) says the Temporal frontend could not be reached -- down,
    restarting, a network in between, or refusing calls for load -- rather than answering: an outage to wait out,
    not news about a search."""
    for current in causes(error):
        if isinstance(current, InfrastructureError):
            return False  # an outage already waited out past its patience (engine/outages.py): never waited out twice
        # "h2 protocol error": the HTTP/2 connection under the client broke (seen once on the call after a query
        # that ran out its deadline): the connection's failure, not an answer.
        if isinstance(current, RPCError) and (current.status in _UNREACHABLE or connection_broke(current)):
            return True
        # Client.connect has no status code: "Failed client connect: Server connection error: tonic::transport…".
        if isinstance(current, RuntimeError) and str(current).startswith("Failed client connect"):
            return True
        if is_outage(current):
            return True
    return False


def overloaded(error: BaseException) -> bool:
    """True when Temporal refused a call for load (RESOURCE_EXHAUSTED: a rate limit, a busy persistence), which
    ``unreachable`` waits out too; told apart only to say so."""
    return any(isinstance(e, RPCError) and e.status == RPCStatusCode.RESOURCE_EXHAUSTED for e in causes(error))


def connection_broke(error: BaseException) -> bool:
    """True when a call failed because the HTTP/2 connection under the client broke ("h2 protocol error",
    "transport error"), whatever the status code says."""
    return any(
        isinstance(e, RPCError) and any(mark in e.message for mark in _CONNECTION_FAILURES) for e in causes(error)
    )


def no_worker(error: BaseException) -> bool:
    """True when Temporal answered that no worker polls the task queue a query needs (``kf search show`` of a
    search whose workers are all gone), or a query ran out its deadline unanswered (a search whose queue no worker
    ever polled: Temporal holds the query until then): a service that is down, not news about the search."""
    return no_poller(error) or query_timed_out(error)


def no_poller(error: BaseException) -> bool:
    """True when Temporal refused a query at once because no worker has polled its task queue lately."""
    return any(
        isinstance(e, RPCError) and e.status == RPCStatusCode.FAILED_PRECONDITION and "poller" in e.message
        for e in causes(error)
    )


def query_timed_out(error: BaseException) -> bool:
    """True when a query ran out its deadline with no answer: no worker took it, or the one that did is busy."""
    return any(
        isinstance(e, RPCError)
        and e.status in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED)
        # The client's deadline says "Timeout expired"; the server's "query timed out before a worker could ...".
        and ("Timeout" in e.message or "timed out" in e.message)
        for e in causes(error)
    )


def not_found(error: BaseException) -> bool:
    """True when Temporal answered that what was asked for (a search id) does not exist."""
    return any(isinstance(e, RPCError) and e.status == RPCStatusCode.NOT_FOUND for e in causes(error))
