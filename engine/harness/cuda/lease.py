"""One timed job per GPU: a file lock per device, held while a benchmark (or a bandwidth measurement) runs.

Two benchmarks on one GPU would time each other's kernels; a validation running beside a benchmark would
steal its SMs and memory bandwidth in the middle of a timed call. So a timed job takes the device's lock
exclusively, and validation takes it shared: validations run side by side, never during a timed job. The
lock is an ``flock`` on ``gpu-<device>.lock`` under the machine folder, so it holds across every process of
this machine (several `kf worker` processes, a `kf evaluate` next to them) and dies with its holder.

The device is named by what the judge's child will see: the first entry of ``CUDA_VISIBLE_DEVICES`` (a
`kf worker --gpu N` sets it to ``N``), else ``0``.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from engine import config

# How long a job waits for its GPU before giving up (a hung validation is killed well before this).
DEFAULT_WAIT_S = 1800.0


class GpuBusy(RuntimeError):
    """The GPU's lock was not free within the wait: the machine's problem, never a kernel's verdict."""


def visible_device() -> str:
    """The device the CUDA child uses, as CUDA_VISIBLE_DEVICES names it (an index or a GPU-… UUID)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def lock_path(device: str, cache_dir: Path | None = None) -> Path:
    """The lock file of ``device`` (characters other than letters, digits, '-' and '.' become '_')."""
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in device)
    return config.machine_dir(cache_dir) / f"gpu-{safe}.lock"


class GpuLease:
    """The lock of this process's GPU, exclusive (timing) or shared (validation); use as a context manager."""

    def __init__(
        self,
        *,
        exclusive: bool,
        cache_dir: Path | None = None,
        wait_s: float = DEFAULT_WAIT_S,
        device: str | None = None,
    ) -> None:
        self.device = device if device is not None else visible_device()
        self.exclusive = exclusive
        self.path = lock_path(self.device, cache_dir)
        self.wait_s = wait_s
        self.waited_s = 0.0
        self._file: IO[str] | None = None

    def acquire(self) -> GpuLease:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a")  # held until release()
        mode = (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(handle, mode)
                break
            except OSError:
                if time.monotonic() - started > self.wait_s:
                    handle.close()
                    raise GpuBusy(
                        f"GPU {self.device} stayed busy for {self.wait_s:.0f}s (lock {self.path}): another timed job "
                        "holds it; retry later"
                    ) from None
                time.sleep(0.05)
        self.waited_s = time.monotonic() - started
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor drops the flock
            self._file = None

    def __enter__(self) -> GpuLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
