"""Connecting to Temporal the one way Kernel Factory does: pydantic payloads, the configured namespace."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from engine.config import temporal_namespace
from engine.connections import temporal_address
from engine.errors import ConfigurationError


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
