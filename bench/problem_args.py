"""The benchmarks' ``--problems`` option: names checked before anything is recorded or started."""

from __future__ import annotations

import argparse

from engine.errors import UserError
from engine.problems import load_problem


def problem_list(parser: argparse.ArgumentParser, option: str, text: str) -> tuple[str, ...]:
    """A comma-separated list of built-in problem names, each loaded once to check it exists: an unknown one ends
    the benchmark with the option, the name and the names there are (exit status 2), before it records anything."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        try:
            load_problem(name)
        except UserError as error:
            parser.error(f"{option}: {error}")
    return names
