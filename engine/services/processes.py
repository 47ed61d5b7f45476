"""Processes of the embedded servers: is a pid still the program we started, and stopping it.

A pid alone proves little: after a crash or a reboot the number may belong to any other program. So a
server counts as running only when its pid is alive *and* its command line is the one we launched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

import psutil


def command_line(pid: int) -> list[str] | None:
    """The argv of process ``pid``; None if there is no such process or it already exited (a zombie)."""
    if pid <= 0:
        return None
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            _reap(pid)
            return None
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def flag(argv: list[str], name: str) -> str | None:
    """The value after option ``name`` in ``argv`` (``--port 7233``), or None when it is not there."""
    for index, value in enumerate(argv[:-1]):
        if value == name:
            return argv[index + 1]
    return None


def is_alive(pid: int) -> bool:
    """True while process ``pid`` exists and has not exited."""
    return command_line(pid) is not None


def describe(pid: int) -> str:
    """``pid 42 (`sleep 100`)`` for messages, or ``pid 42 (not running)``."""
    argv = command_line(pid)
    if argv is None:
        return f"pid {pid} (not running)"
    shown = " ".join(" ".join(argv).split())
    return f"pid {pid} (`{shown[:80]}{'…' if len(shown) > 80 else ''}`)"


def find(matches: Callable[[list[str]], bool]) -> list[int]:
    """Pids of the running processes whose command line ``matches``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        # Unreadable (another user's, gone meanwhile): psutil leaves the attribute None.
        argv = process.info["cmdline"]
        if argv and matches(argv):
            found.append(process.pid)
    return sorted(found)


def terminate(pid: int, timeout: float = 20.0) -> bool:
    """Stop ``pid``: SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. True if it had to be killed."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_for_exit(pid, timeout):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_for_exit(pid, 5.0)
    return True


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` has exited; False if it still runs after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while is_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _reap(pid: int) -> None:
    # A server started by this very process (tests, `kf demo`) stays a zombie until its parent waits
    # for it; reap it so the pid is freed. Not our child: nothing to do.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
