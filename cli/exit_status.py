"""What `kf` exits with, and which errors mean "the machine or a service failed" rather than the input.

One table, read by `kf --help` (its epilog), by :func:`cli.main` and by the commands that return a status
themselves, so the documented statuses and the ones returned cannot drift apart.
"""

from __future__ import annotations

import signal
import sys

from engine.errors import InfrastructureError, ServiceUnavailable, UserError
from engine.outages import is_outage, is_read_only, is_shortage

OK = 0
"""The command did what it was asked."""
FAILED = 1
"""A failure the command reports as its answer: a kernel's verdict other than ok, a failed search, a broken
chain, a database not at the migrations' state."""
BAD_INPUT = 2
"""Bad input: argparse's refusals and every UserError, refused before any server is contacted wherever the value
alone shows it (that an id names no search only Temporal can say, or for `--resume-from`, the event log)."""
MACHINE = 3
"""The machine or a service failed, not the input and not the kernel: Postgres or Temporal not running or
not answering, a machine calibration or a sandbox that failed."""
INTERRUPTED = 128 + signal.SIGINT
"""Interrupted (Ctrl-C)."""
TERMINATED = 128 + signal.SIGTERM
"""Terminated (SIGTERM), after the command cleaned up (`kf evaluate` kills its sandboxes first)."""
OUTPUT_CLOSED = 128 + signal.SIGPIPE
"""The reader of the output went away (`kf … | head`): what a shell reports for any command killed by SIGPIPE."""

STATUSES: tuple[tuple[int, str], ...] = (
    (OK, "success"),
    (FAILED, "a failure the command reports: a kernel's verdict other than ok, a failed search, a broken chain"),
    (BAD_INPUT, "bad input: the message names the option, the value and what is allowed"),
    (
        MACHINE,
        "the machine or a service failed, not the input or the kernel: Postgres or Temporal down or "
        "unreachable, a machine calibration or sandbox that failed",
    ),
    (INTERRUPTED, "interrupted (Ctrl-C)"),
    (OUTPUT_CLOSED, "the reader of the output went away (`kf … | head`)"),
    (TERMINATED, "terminated (SIGTERM), after cleaning up"),
)
"""Every status `kf` exits with, and what it means: the `kf --help` epilog and the README's table."""


def epilog() -> str:
    """The exit statuses, one per line, for the end of `kf --help`."""
    return "exit status:\n" + "\n".join(f"  {status:<3} {meaning}" for status, meaning in STATUSES)


def classify(error: BaseException) -> tuple[int, str] | None:
    """The exit status for ``error`` and the one line that says it, or None for a bug (its traceback is due).

    3: the machine or a service failed -- a server not running or not answering (before or during the command),
    an outage waited out past the patience, no worker polling a search's queue, a calibration or a sandbox that
    could not run. 2: bad input -- every UserError, and an id Temporal says names nothing."""
    # Imported here: the harness is heavy, and only a command that already failed pays for it.
    from engine.harness.driver import SandboxFailure
    from engine.harness.machine import CalibrationFailed

    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, ServiceUnavailable | InfrastructureError | CalibrationFailed | SandboxFailure):
        return MACHINE, text
    if is_shortage(error):
        return MACHINE, (
            f"Postgres ran short of disk, memory or connections ({type(error).__name__}: {text}); free them where "
            "it runs and run again (nothing recorded before was lost)"
        )
    if is_read_only(error):
        return MACHINE, (
            f"Postgres refused to write: it is read-only ({type(error).__name__}: {text}), a standby or in "
            "maintenance; point KF_DATABASE_URL at the primary or wait until it is writable, and run again (nothing "
            "recorded before was lost)"
        )
    if is_outage(error):
        return MACHINE, f"Postgres stopped answering ({type(error).__name__}: {text}); check `kf status` and run again"
    # Temporal's answers, asked about only when Temporal is loaded: `kf evaluate` never imports it.
    if "temporalio" in sys.modules:
        from activities.temporal_client import no_worker, not_found, overloaded, unreachable

        # A query's deadline can say DEADLINE_EXCEEDED, as an unreachable frontend does: its message tells them
        # apart, so the query's own reading comes first.
        if no_worker(error):
            return MACHINE, (
                f"no worker answers for this search ({text}); start one with `kf worker` "
                "(`kf audit SEARCH_ID` shows what its event log holds without one)"
            )
        if overloaded(error):
            return MACHINE, (
                f"Temporal refused the call for load ({text}): it is busy or over a rate limit (its dynamic config "
                "frontend.namespaceRPS); run again when it is quieter, or raise the limit"
            )
        if unreachable(error):
            return MACHINE, f"Temporal stopped answering ({text}); check `kf status` and run again"
        from temporalio.client import WorkflowUpdateFailedError

        if isinstance(error, WorkflowUpdateFailedError):
            # The search refused the update (its validator): the value, not the machine.
            cause = getattr(error.cause, "message", None) or str(error.cause or error)
            return BAD_INPUT, f"the search refused the change: {cause}"
        if not_found(error):
            if "already completed" in text:
                return BAD_INPUT, f"{text}: the search has ended (`kf search show ID` says how)"
            return BAD_INPUT, f"{text}; `kf search list` shows the search ids"
    if isinstance(error, UserError):
        return BAD_INPUT, str(error)
    return None
