"""Server log files: where a failure to start is explained."""

from __future__ import annotations

from pathlib import Path


def size(log: Path) -> int:
    """The current length of ``log`` in bytes (0 if it does not exist): remember it before a start."""
    try:
        return log.stat().st_size
    except FileNotFoundError:
        return 0


def tail(log: Path, since: int = 0, lines: int = 20) -> str:
    """The last ``lines`` lines written to ``log`` after byte offset ``since``, indented for a message."""
    try:
        with log.open("rb") as stream:
            stream.seek(since)
            text = stream.read().decode(errors="replace")
    except FileNotFoundError:
        return "    (no log file)"
    kept = text.splitlines()[-lines:] or ["(the log is empty)"]
    return "\n".join(f"    {line}" for line in kept)
