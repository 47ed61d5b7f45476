"""A loaded machine for one test: chosen processes get a share of a CPU, stopped (SIGSTOP) for the rest of every
tenth of a second, as a machine loaded many times over leaves them waiting for a CPU."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import psutil

PERIOD_S = 0.1


def _each(processes: list[psutil.Process], action: Callable[[psutil.Process], None]) -> None:
    for process in processes:
        try:
            action(process)
        except psutil.Error:
            pass  # ended meanwhile


@contextlib.contextmanager
def slowed(find: Callable[[], list[psutil.Process]], share: float = 0.1) -> Iterator[None]:
    """While inside, the processes ``find`` returns (asked again every PERIOD_S) run ``share`` of the time."""
    done = threading.Event()

    def throttle() -> None:
        while not done.is_set():
            stopped = find()
            _each(stopped, psutil.Process.suspend)
            time.sleep(PERIOD_S * (1 - share))
            _each(stopped, psutil.Process.resume)
            time.sleep(PERIOD_S * share)

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        _each(find(), psutil.Process.resume)


def descendants_named(names: set[str]) -> Callable[[], list[psutil.Process]]:
    """A ``find`` for :func:`slowed`: this process's descendants whose name is one of ``names``."""

    def find() -> list[psutil.Process]:
        found = []
        for process in psutil.Process().children(recursive=True):
            try:
                if process.name() in names:
                    found.append(process)
            except psutil.Error:
                pass
        return found

    return find
