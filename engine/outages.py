"""Outages: what is an infrastructure failure rather than a kernel's outcome, and how one is waited out.

An outcome is the kernel's only when the kernel caused it (DESIGN.md). A Postgres that refuses connections or
drops them mid-query, a Temporal frontend that is restarting, a harness process killed from outside (the OOM
killer, an operator) are infrastructure failures: they are waited out -- retried with back-off for as long as
an operator takes to restart a server (``KF_OUTAGE_PATIENCE_S``, engine/config.py) -- and then fail loudly
as :class:`~engine.errors.InfrastructureError`. They are never recorded, counted, summarised or reused as a
kernel's verdict.

- :func:`is_outage`: an error that says the database (or the network to it) is unreachable.
- :func:`wait_out`: run an operation again after each outage, with back-off, until it succeeds or the
  patience is spent.
- :data:`KERNEL_SIGNALS` and :func:`is_kernel_outcome`: which deaths a candidate can be shown to have caused,
  and so which recorded outcomes are a kernel's verdict at all.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from engine.config import outage_patience_s
from engine.errors import InfrastructureError

T = TypeVar("T")
log = logging.getLogger(__name__)

FIRST_DELAY_S = 0.5
"""The first wait after an outage is noticed; each later one doubles, up to MAX_DELAY_S."""
MAX_DELAY_S = 10.0
"""The longest wait between two tries: a restarted server is used within this time of coming back."""
TICK_S = 1.0
"""While waiting, ``on_wait`` is called at least this often (an activity heartbeats from it)."""

KERNEL_SIGNALS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGTRAP,
        signal.SIGABRT,
        signal.SIGSYS,
        signal.SIGXCPU,
        signal.SIGXFSZ,
    }
)
"""Signals a candidate's own execution raises: a fault, a trap, an abort, a system call the sandbox refused,
a CPU-time or file-size limit it ran into. Any other signal (SIGKILL, SIGTERM, SIGINT, SIGHUP…) comes from
outside the process -- the OOM killer, an operator, a shutdown -- or from the process itself, and the two
cannot be told apart: such a death is re-run, never the kernel's ``crash``."""


@functools.cache
def _postgres_outages() -> tuple[tuple[type[BaseException], ...], Path]:
    """asyncpg's errors that mean the database is unreachable, and asyncpg's folder."""
    # Imported on first use: the judge imports this module for KERNEL_SIGNALS, and the CUDA judge runs on GPU
    # machines where asyncpg is not installed.
    import asyncpg

    errors: tuple[type[BaseException], ...] = (
        # Class 08: the connection failed, was refused or was lost (ConnectionDoesNotExistError: "connection was
        # closed in the middle of operation" when the server stops under a query).
        asyncpg.PostgresConnectionError,
        # Class 57: the server is shutting down, crashed or is still starting up.
        asyncpg.exceptions.AdminShutdownError,
        asyncpg.exceptions.CrashShutdownError,
        asyncpg.exceptions.CannotConnectNowError,
        # 57014: a statement cancelled from outside (pg_cancel_backend, a statement_timeout an operator set): run
        # again, it was rolled back.
        asyncpg.exceptions.QueryCanceledError,
        *_postgres_shortages(),
        *_postgres_read_only(),
    )
    return errors, Path(asyncpg.__file__).resolve().parent


def _postgres_shortages() -> tuple[type[BaseException], ...]:
    """asyncpg's errors that mean the database's machine ran short, not that the request was wrong."""
    import asyncpg

    return (
        # Class 53: out of disk ("could not extend file"), memory or connections. Class 58: the server's own I/O
        # failed. A statement that failed so was rolled back, and passes once space or memory is freed.
        asyncpg.exceptions.InsufficientResourcesError,
        asyncpg.exceptions.PostgresSystemError,
    )


def _postgres_read_only() -> tuple[type[BaseException], ...]:
    """asyncpg's errors that mean the database takes reads but refuses writes for now."""
    import asyncpg

    # 25006: a hot standby (a failover under way, the client still on the old primary's address), or a server an
    # operator made read-only for maintenance (default_transaction_read_only). Writes pass once it is writable.
    return (asyncpg.exceptions.ReadOnlySQLTransactionError,)


def is_read_only(error: BaseException) -> bool:
    """True when ``error``, or an error it was raised from, is the database refusing writes for now (read-only)."""
    read_only = _postgres_read_only()
    return any(isinstance(cause, read_only) for cause in causes(error))


def is_shortage(error: BaseException) -> bool:
    """True when ``error``, or an error it was raised from, is the database's machine running short of disk,
    memory or connections (an outage whose fix is to free them, not to restart the server)."""
    shortages = _postgres_shortages()
    return any(isinstance(cause, shortages) for cause in causes(error))


def is_outage(error: BaseException) -> bool:
    """True when ``error``, or an error it was raised from, says the database or the network is unreachable.

    A refused, reset or timed-out connection is an outage wherever it was raised; any other OSError only when
    the database driver raised it (a Postgres stopped on its Unix socket is ``FileNotFoundError`` there, and a
    FileNotFoundError anywhere else is a bug, not an outage). A clear error wrapping one (EventStore.connect's
    ConfigurationError) is an outage too."""
    postgres_outages, asyncpg_dir = _postgres_outages()
    for cause in causes(error):
        if isinstance(cause, InfrastructureError):
            return False  # already waited out, past the patience: never waited out twice
        if isinstance(cause, (*postgres_outages, ConnectionError, TimeoutError)):
            return True
        if isinstance(cause, OSError) and _raised_in(cause, asyncpg_dir):
            return True
    return False


def causes(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from, nearest first (each once: a chain can loop)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = raised_from(current)
    return chain


def raised_from(error: BaseException) -> BaseException | None:
    """The error ``error`` was raised from (``raise … from``), or during the handling of unless ``from None``."""
    return error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def _raised_in(error: BaseException, folder: Path) -> bool:
    traceback = error.__traceback__
    while traceback is not None:
        if Path(traceback.tb_frame.f_code.co_filename).resolve().is_relative_to(folder):
            return True
        traceback = traceback.tb_next
    return False


async def wait_out(
    operation: Callable[[], Awaitable[T]],
    *,
    what: str,
    transient: Callable[[BaseException], bool] = is_outage,
    patience_s: float | None = None,
    on_wait: Callable[[], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> T:
    """``await operation()``, tried again after every error ``transient`` calls an outage, with back-off
    (FIRST_DELAY_S doubling up to MAX_DELAY_S), until it succeeds or ``patience_s`` (default: the configured
    outage patience) has passed since the outage began; then InfrastructureError naming ``what``.

    ``on_wait`` is called at least every TICK_S while waiting: an activity heartbeats there, so Temporal
    knows the step is alive and waiting, not lost. Each wait is announced through ``say`` (default: a logged
    warning), e.g. "Temporal unreachable, retrying in 4 s (…)". Any other error is raised as it is."""
    patience = outage_patience_s() if patience_s is None else patience_s
    began: float | None = None
    delay = FIRST_DELAY_S
    while True:
        try:
            return await operation()
        except Exception as error:
            if not transient(error):
                raise
            now = time.monotonic()
            began = now if began is None else began
            waited = now - began
            if waited >= patience:
                if is_shortage(error):
                    fix = "free disk space, memory or connections where it runs"
                elif is_read_only(error):
                    fix = "make it writable (end the maintenance, or point KF_DATABASE_URL at the primary)"
                else:
                    fix = "restart it (`kf up` for the embedded servers)"
                raise InfrastructureError(
                    f"{what} stayed unreachable for {waited:.0f} s, past the outage patience of {patience:g} s "
                    f"({type(error).__name__}: {error}); {fix}, or raise KF_OUTAGE_PATIENCE_S to wait longer"
                ) from error
            pause = min(delay, patience - waited)
            (say or log.warning)(
                f"{what} unreachable, retrying in {pause:.1f} s ({type(error).__name__}: {error}; waited "
                f"{waited:.0f} s of {patience:g} s)"
            )
            await _sleep(pause, on_wait)
            delay = min(delay * 2, MAX_DELAY_S)


async def _sleep(seconds: float, on_wait: Callable[[], None] | None) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if on_wait is not None:
            on_wait()
        await asyncio.sleep(min(left, TICK_S))


def is_kernel_outcome(verdict: str, signal_number: int | None = None) -> bool:
    """True when a recorded step outcome is the kernel's verdict: not ``harness_error``, and not a ``crash``
    from a signal the kernel cannot be shown to have caused (see KERNEL_SIGNALS; logs written before the
    harness re-ran such deaths hold them). Such outcomes are never counted, summarised or reused."""
    if verdict == "harness_error":
        return False
    return not (verdict == "crash" and signal_number is not None and signal_number not in KERNEL_SIGNALS)
