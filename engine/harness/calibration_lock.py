"""One calibration at a time per machine: a lock across processes around measuring what a cache file will hold.

Two workers started together on one machine (or two test processes) would both find no cached bandwidth or
noise floor, both measure, and each time its A/A runs against the other's load: two slower calibrations
and a noise floor inflated by the other's measurement. Under this lock the second process waits, then reads
what the first one cached.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def calibration_lock(cache_file: Path) -> Iterator[None]:
    """Held while this process measures what ``cache_file`` will cache (an ``flock`` on ``<cache_file>.lock``,
    dropped when the process dies, so a killed calibration never blocks the next)."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    with cache_file.with_suffix(".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
