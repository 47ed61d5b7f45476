"""Connecting to Temporal the one way Kernel Factory does: pydantic payloads, the configured namespace."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from engine.config import temporal_namespace
from engine.connections import temporal_address
from engine.errors import ConfigurationError
from engine.outages import is_outage, raised_from

_UNREACHABLE = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)


async def connect(address: str | None = None, namespace: str | None = None) -> Client:
    """A client for ``address`` (default: KF_TEMPORAL_ADDRESS or the embedded dev server)."""
    target = address or temporal_address()
    try:
        return await Client.connect(
            target, namespace=namespace or temporal_namespace(), data_converter=pydantic_data_converter
        )
    except RuntimeError as error:
        raise ConfigurationError(
            f"cannot reach Temporal at {target}: {error}; run `kf up` for the embedded server, "
            "or set KF_TEMPORAL_ADDRESS to a running frontend"
        ) from error


def unreachable(error: BaseException) -> bool:
    """True when ``error`` (or one it was raised from) says the Temporal frontend could not be reached -- down,
    restarting, a network in between -- rather than answering: an outage to wait out, not news about a search."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RPCError) and (current.status in _UNREACHABLE or "transport error" in current.message):
            return True
        # Client.connect has no status code: "Failed client connect: Server connection error: tonic::transport…".
        if isinstance(current, RuntimeError) and str(current).startswith("Failed client connect"):
            return True
        if is_outage(current):
            return True
        current = raised_from(current)
    return False
