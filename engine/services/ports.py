"""TCP ports of the embedded servers: which ones to use, whether they are free, who holds them."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from engine.errors import ConfigurationError
from engine.services import processes


def port_from_env(variable: str, default: int) -> int:
    """The port named by environment variable ``variable``, or ``default`` when it is unset."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigurationError(f"{variable}={raw!r} is not a TCP port; set it to a number from 1 to 65535")
    return int(raw)


def is_free(host: str, port: int) -> bool:
    """True when a server could listen on ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Same option the servers set: connections of a stopped server lingering in TIME_WAIT do not
        # block a new listener, so they must not make the port look taken either.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def accepts_connections(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts a TCP connection on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def holder_pid(port: int) -> int | None:
    """The pid of the process that listens on TCP ``port``, when Linux lets us see it."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for pid in processes.find(lambda argv: True):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        return pid
    return None


def _listening_inodes(port: int) -> set[str]:
    listening = "0A"  # TCP_LISTEN in /proc/net/tcp's state column
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == listening:
                    inodes.add(fields[9])
    return inodes
