"""Argument types for `kf` options whose value a pydantic model bounds.

The option only parses the text (an integer, a number, a search id); the model checks the range, so the
command line and the Temporal UI refuse the same values. What the parse error and `--help` say is allowed
comes from the same model (engine/input_errors.py), so neither can drift from the bound.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from pydantic import BaseModel, TypeAdapter, ValidationError

from engine.input_errors import allowed
from engine.search.spec import ProblemName, SearchId, Target


def string(model: type[BaseModel], path: str) -> Callable[[str], str]:
    """An argparse ``type`` for text; the model checks its length and shape."""
    del model, path  # any text parses; the signature matches `integer` and `number`
    return str


def integer(model: type[BaseModel], path: str) -> Callable[[str], int]:
    """An argparse ``type`` that reads an integer, naming the field's range when the text is not one."""

    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; allowed: {allowed(model, path)}") from None

    return parse


def number(model: type[BaseModel], path: str) -> Callable[[str], float]:
    """An argparse ``type`` that reads a number, naming the field's range when the text is not one. ``inf``
    and ``nan`` parse here and are refused by the model, with the same message as from a JSON spec."""

    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; allowed: {allowed(model, path)}") from None

    return parse


_SEARCH_ID: TypeAdapter[str] = TypeAdapter(SearchId)


def search_id(text: str) -> str:
    """An argparse ``type`` for a search id: refused before any server is asked about it."""
    try:
        return _SEARCH_ID.validate_python(text)
    except ValidationError as error:
        reason = error.errors(include_url=False)[0]["msg"]
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a search id ({reason}); a search id is 1 to 1000 characters without control "
            "characters, as `kf search list` prints them"
        ) from None


_PROBLEM: TypeAdapter[str] = TypeAdapter(ProblemName)


def problem_name(text: str) -> str:
    """An argparse ``type`` for a problem name or folder, bounded like a search's `problem`."""
    try:
        return _PROBLEM.validate_python(text)
    except ValidationError as error:
        reason = error.errors(include_url=False)[0]["msg"]
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: {reason}; pass a built-in problem name or a folder") from None


_TARGET: TypeAdapter[str] = TypeAdapter(Target)


def target(text: str) -> str:
    """An argparse ``type`` for a target: `cpu`, `cpu-<arch>-<isa>` or `cuda-sm<NN>`, as a search's `target`."""
    try:
        return _TARGET.validate_python(text)
    except ValidationError as error:
        reason = error.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise argparse.ArgumentTypeError(reason) from None


def queue_prefix(text: str) -> str:
    """An argparse ``type`` for a task queue prefix, by a search's ``task_queue_prefix`` rule: a worker or a status on
    a prefix no search can name would wait for (or report on) queues nothing ever uses."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a task queue prefix; use 1 to 64 letters, digits, '_', '.' or '-' (e.g. kf, team-a)"
        )
    return text
