"""The ``kf`` command line: one module per group of commands, each with a ``register(subparsers)``.

A command's handler returns the process exit status. Errors the user can fix are raised as
``engine.errors.UserError`` and printed as one clear line, without a traceback.

Exit status: 0 success; 1 a failure the command reports (a kernel's verdict, a failed search, a broken chain);
2 bad input (argparse's refusals and every UserError: the message names the option or field, the value and
what is allowed), checked before any server is contacted; 3 the machine failed, not the kernel; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from engine.errors import UserError

# Each module registers its subcommands. Listed once here so `kf --help` has a stable order.
COMMAND_MODULES = [
    "cli.services",
    "cli.db",
    "cli.evaluate",
    "cli.worker",
    "cli.search",
    "cli.lessons",
    "cli.problem",
    "cli.demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kf", description="Kernel Factory: durable search for fast, correct compute kernels."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # argparse refused an option (status 2, message printed) or printed --help (0)
        return done.code if isinstance(done.code, int) else 2
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        status: int = args.handler(args)
    except UserError as error:
        print(f"kf: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


def entry() -> NoReturn:
    """The ``kf`` command: :func:`main`, then leave without the interpreter's shutdown.

    Why: Temporal's Python client can crash while the interpreter tears down its runtime's threads
    (temporalio/sdk-python#300: SIGSEGV or "Fatal Python error: PyGILState_Release", after the command has
    printed its result), and the crash would replace the exit status scripts rely on. Everything a command
    must finish (its output, files, services it leaves running) is done by the time main returns; only
    the output buffers and log handlers are left to flush."""
    status = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # `kf … | head` closed the pipe: the output is not wanted
            pass
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    entry()
