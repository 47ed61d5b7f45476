"""The ``kf`` command line: one module per group of commands, each with a ``register(subparsers)``.

A command's handler returns the process exit status. Errors the user can fix are raised as
``engine.errors.UserError`` and printed as one clear line, without a traceback.

Exit status (cli/exit_status.py, printed by `kf --help`): 0 success; 1 a failure the command reports (a kernel's
verdict, a failed search, a broken chain); 2 bad input (argparse's refusals and every UserError: the message
names the option or field, the value and what is allowed), checked before any server is contacted; 3 the
machine or a service failed, not the input or the kernel (Postgres or Temporal down or unreachable, a
calibration or sandbox that failed), said in one line without a traceback; 130 interrupted; 143 terminated;
141 the reader of the output went away (`kf lessons | head`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn

from cli import exit_status
from cli.parser import KfArgumentParser
from engine.errors import NoEvents

# Each module registers its subcommands. Listed once here so `kf --help` has a stable order.
COMMAND_MODULES = [
    "cli.services",
    "cli.db",
    "cli.evaluate",
    "cli.worker",
    "cli.search",
    "cli.schedule",
    "cli.lessons",
    "cli.problem",
    "cli.export",
    "cli.report",
    "cli.demo",
]


# The module of each command, so that a command imports its own module only: every module's imports together
# (numpy, the harness, Temporal's client, the report's plotting) cost a second of start-up on every call. A
# command missing here still works, through the whole parser (tests/test_cli_surface.py checks the map).
MODULE_OF = {
    "up": "cli.services",
    "down": "cli.services",
    "status": "cli.services",
    "db": "cli.db",
    "evaluate": "cli.evaluate",
    "worker": "cli.worker",
    "search": "cli.search",
    "audit": "cli.search",
    "schedule": "cli.schedule",
    "lessons": "cli.lessons",
    "problem": "cli.problem",
    "export": "cli.export",
    "report": "cli.report",
    "demo": "cli.demo",
}


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `kf` parser; with ``commands`` (names of MODULE_OF), only the modules of those commands registered."""
    # Every subparser is a KfArgumentParser too (argparse makes them of the parent's class): one help format,
    # with every option's default, for every command.
    parser = KfArgumentParser(
        prog="kf",
        description="Kernel Factory: durable search for fast, correct compute kernels.",
        epilog=exit_status.epilog(),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = COMMAND_MODULES if commands is None else [MODULE_OF[command] for command in commands]
    for name in dict.fromkeys(modules):
        importlib.import_module(name).register(subparsers)
    return parser


def _commands(argv: Sequence[str]) -> list[str] | None:
    """The commands whose modules parsing ``argv`` needs: the one it names, none for `kf --version`, or None
    for all of them (`kf --help`, no command, or a word that names none: argparse then lists them all)."""
    if list(argv[:1]) == ["--version"]:
        return []
    if argv and argv[0] in MODULE_OF:
        return [argv[0]]
    return None


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, as the wheel or the editable install has it)."""
    try:
        return version("kernel-factory")
    except PackageNotFoundError:  # imported from a bare checkout that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's arguments) and return its exit status (cli/exit_status.py)."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        return exit_status.INTERRUPTED
    except BrokenPipeError as error:
        if not _output_closed():
            return _failed(error)
        # `kf lessons | head`: the reader has what it wanted. Later writes (the final flush) go nowhere instead
        # of raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_status.OUTPUT_CLOSED
    except Exception as error:
        return _failed(error)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser(_commands(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # argparse refused an option (status 2, message printed) or printed --help (0)
        return done.code if isinstance(done.code, int) else exit_status.BAD_INPUT
    if not getattr(args, "handler", None):
        parser.print_help()
        return exit_status.BAD_INPUT
    status: int = args.handler(args)
    return status


def _failed(error: Exception) -> int:
    """The status for an error a command raised, said in one line on stderr (cli/exit_status.py); a bug's
    traceback is re-raised."""
    if isinstance(error, NoEvents):
        # The event log has nothing of that id; Temporal may know the search (ended before its first step).
        from cli.no_events import explained

        error = explained(error)
    known = exit_status.classify(error)
    if known is None:
        raise error
    status, line = known
    print(f"kf: error: {line}", file=sys.stderr)
    return status


def _output_closed() -> bool:
    """True when the reader of standard output has gone away (a pipe whose other end was closed)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # POLLERR is always reported: the pipe has no reader
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        return False


def entry() -> NoReturn:
    """The ``kf`` command: :func:`main`, then leave without the interpreter's shutdown.

    Why: Temporal's Python client can crash while the interpreter tears down its runtime's threads
    (temporalio/sdk-python#300: SIGSEGV or "Fatal Python error: PyGILState_Release", after the command has
    printed its result), and the crash would replace the exit status scripts rely on. Everything a command
    must finish (its output, files, services it leaves running) is done by the time main returns; only
    the output buffers and log handlers are left to flush. A bug's traceback is printed here (exit status 1),
    since the interpreter, which would print it, is not given the chance."""
    try:
        status = main()
    except SystemExit as done:  # a handler's sys.exit: its status, or its message and 1, as Python would
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
        if isinstance(done.code, int):
            status = done.code
        else:
            status = exit_status.OK if done.code is None else exit_status.FAILED
    except Exception:
        traceback.print_exc()
        status = exit_status.FAILED
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # `kf … | head` closed the pipe before the last of the output reached it
            status = exit_status.OUTPUT_CLOSED if status == exit_status.OK else status
        except ValueError:  # a stream the command closed
            pass
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    entry()
