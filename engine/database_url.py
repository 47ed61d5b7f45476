"""Postgres URLs and connections: check a URL before use, never print its password, connect with errors
that say what to do.

Accepted forms (the ones libpq and asyncpg understand)::

    postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE
    postgresql://USER@/DATABASE?host=/path/to/socket/dir      (unix socket, as the embedded server gives)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import SplitResult, urlsplit

import asyncpg

from engine.errors import ConfigurationError, ServiceUnavailable
from engine.outages import is_outage

EXPECTED_FORM = (
    "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE "
    "(or postgresql://USER@/DATABASE?host=/socket/dir for a unix socket)"
)
_SCHEMES = ("postgresql", "postgres")


def mask_password(url: str) -> str:
    """The URL with its password replaced by ``***``, safe to print and log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return SplitResult(parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment).geturl()


def check_database_url(url: str) -> str:
    """Return ``url`` if it is a Postgres URL; raise ConfigurationError naming it (masked) otherwise."""

    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(
            f"malformed database URL {mask_password(url)!r}: {why}; expected {EXPECTED_FORM}. "
            "Fix KF_DATABASE_URL (or --database-url)."
        )

    if not isinstance(url, str) or not url.strip():
        raise refuse("it is empty")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as error:
        raise refuse(str(error)) from None
    if parts.scheme not in _SCHEMES:
        raise refuse(f"the scheme must be postgresql:// (got {parts.scheme + '://' if parts.scheme else None})")
    if not parts.netloc and "host=" not in parts.query:
        raise refuse("it names no host and no socket directory")
    if port == 0:
        raise refuse("port 0 is not a port")
    database = parts.path.lstrip("/")
    if "/" in database:
        raise refuse(f"the database name {database!r} contains '/'")
    return url


async def connect(url: str, *, timeout: float = 10.0) -> asyncpg.Connection:
    """One connection, with a clear error if the URL is malformed or nothing answers there."""
    check_database_url(url)
    try:
        return await asyncpg.connect(url, timeout=timeout)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise unreachable(url, error) from error


async def create_pool(
    url: str,
    *,
    min_size: int,
    max_size: int,
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    server_settings: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> asyncpg.Pool:
    """A connection pool, with the same clear errors as :func:`connect`."""
    check_database_url(url)
    try:
        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            init=init,
            server_settings=server_settings,
            timeout=timeout,
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise unreachable(url, error) from error
    assert pool is not None
    return pool


def unreachable(url: str, error: BaseException) -> ConfigurationError:
    """The error for a well-formed URL where no usable database answered: ServiceUnavailable when nothing
    answered at all (refused, timed out, starting up: the machine's failure, `kf` exits 3), a plain
    ConfigurationError when a server answered and refused (no such database, a wrong password: exit 2)."""
    reason = str(error) or type(error).__name__
    kind = ServiceUnavailable if is_outage(error) else ConfigurationError
    return kind(
        f"cannot connect to Postgres at {mask_password(url)!r}: {reason}. "
        "Start the embedded database with `kf up`, or point KF_DATABASE_URL at a running Postgres "
        "(the database must exist)."
    )
