"""How every `kf` command's help reads: one parser class, so every subcommand formats its help the same way.

argparse makes each subparser of its parent's class, so building the top-level `kf` parser as a
:class:`KfArgumentParser` is enough for every command and verb below it to be one too.
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any


class KfHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says it.

    Unlike argparse's own, it stays quiet about the defaults that say nothing: `None` (the help says what an
    option left out means) and `False` (a flag). Descriptions and epilogs keep their line breaks (the exit
    status table of `kf --help`), each line wrapped to the terminal."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        quiet = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if quiet or "default" in text.lower() or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines() or [""]:
            # A line's own leading spaces (a table's rows) are kept, and its continuation lines indented past them.
            lead = indent + line[: len(line) - len(line.lstrip())]
            hanging = lead + "    " if lead != indent else lead
            lines.append(textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=hanging) or lead)
        return "\n".join(lines)


class KfArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that formats its help with :class:`KfHelpFormatter` unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", KfHelpFormatter)
        super().__init__(*args, **kwargs)
