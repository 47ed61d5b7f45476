"""The ``kf`` command line: one module per group of commands, each with a ``register(subparsers)``.

A command's handler returns the process exit status. Errors the user can fix are raised as
``engine.errors.UserError`` and printed as one clear line, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from engine.errors import UserError

# Each module registers its subcommands. Listed once here so `kf --help` has a stable order.
COMMAND_MODULES = [
    "cli.services",
    "cli.db",
    "cli.evaluate",
    "cli.worker",
    "cli.search",
    "cli.lessons",
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
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
