"""Looking for processes a test's candidate or sandbox may have left behind."""

from __future__ import annotations

import psutil


def survivors(token: str) -> list[int]:
    """Processes on this machine whose name carries ``token`` (set by the corpus with PR_SET_NAME)."""
    found = []
    for process in psutil.process_iter(["name"]):
        if token in (process.info["name"] or ""):
            found.append(process.pid)
    return found


def processes_with_argument(token: str) -> list[psutil.Process]:
    """Processes on this machine with ``token`` as one of their command-line arguments."""
    return [process for process in psutil.process_iter(["cmdline"]) if token in (process.info["cmdline"] or [])]
