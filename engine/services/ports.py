"""TCP ports of the embedded servers: which ones to use, whether they are free, who holds them."""

from __future__ import annotations

import socket

import psutil


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
    """The pid of the process that listens on TCP ``port``, when the system lets us see it."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # macOS without root
        return None
    for connection in connections:
        if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port:
            return connection.pid
    return None
