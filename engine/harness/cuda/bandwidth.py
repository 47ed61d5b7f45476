"""How fast is this GPU's memory? The measured HBM bandwidth, the denominator of every CUDA roofline figure.

Measured in the sandboxed CUDA child (no candidate code): device-to-device copies of :func:`copy_bytes`
bytes, far above the L2, timed with CUDA events; the fastest of a few counts, each copy reading and writing
every byte once (2 × bytes moved). A copy is what the memory-bound kernels of the suite do at best (read
inputs, write outputs), so a kernel measured at a small multiple of this bound is a timing to distrust
(``impossible``), and the ratio bound / time is the HBM roofline fraction every report carries.

Measured once per GPU kind (engine/harness/cuda/fingerprint.py ``gpu_key``), cached on disk under the machine
folder (``gpu-bandwidth-<key>.json``) and in the process, like the CPU's limits (engine/harness/machine.py).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError

from engine import config
from engine.hardware import GpuFingerprint
from engine.harness.cuda.fingerprint import gpu_key
from engine.harness.cuda.messages import BandwidthMeasured

if TYPE_CHECKING:
    from engine.harness.cuda.device import Gpu

# The copy: at most this many bytes, at least this multiple of the L2, at most this share of free memory.
MAX_COPY_BYTES = 1 << 30
MIN_L2_MULTIPLE = 8
FREE_MEMORY_SHARE = 0.25
COPY_REPEATS = 10


class HbmBandwidth(BaseModel):
    """A GPU kind's measured device-memory bandwidth, as cached."""

    key: str = Field(description="gpu_key of the GPU it was measured on.")
    gpu: str = Field(description="The GPU's name, for people reading the file.")
    bandwidth_gbs: float = Field(description="2 × copy bytes / fastest copy time, GB/s.")
    copy_bytes: int = Field(description="Bytes per device-to-device copy.")
    repeats: int = Field(description="Copies timed.")
    measured_at: datetime = Field(description="When it was measured (UTC).")


def copy_bytes(l2_bytes: int, free_bytes: int) -> int:
    """Bytes per measuring copy: MAX_COPY_BYTES, but at least MIN_L2_MULTIPLE L2s and at most
    FREE_MEMORY_SHARE of the free memory (split over source and target), rounded down to a MiB."""
    wanted = max(MAX_COPY_BYTES, MIN_L2_MULTIPLE * l2_bytes)
    affordable = int(free_bytes * FREE_MEMORY_SHARE) // 2
    size = min(wanted, affordable)
    return max(1 << 20, size >> 20 << 20)


def hbm_roofline_ns(model: dict[str, int], bandwidth_gbs: float) -> float:
    """The least time one call can take, nanoseconds: the bytes the problem's roofline model says it moves,
    over the measured bandwidth (bytes / GB/s is nanoseconds)."""
    if bandwidth_gbs <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_gbs} GB/s")
    return float(model.get("bytes", 0)) / bandwidth_gbs


def measure_copy_bandwidth(gpu: Gpu, nbytes: int, repeats: int) -> BandwidthMeasured:
    """Time ``repeats`` device-to-device copies of ``nbytes`` with events (in the child)."""
    source, target = gpu.alloc(nbytes), gpu.alloc(nbytes)
    try:
        gpu.fill_bytes(source, 0x3C, nbytes)
        gpu.copy(target, source, nbytes)  # warm-up: first touch of the pages, clocks up
        start, end = gpu.event(), gpu.event()
        best = float("inf")
        for _ in range(repeats):
            gpu.record(start)
            gpu.copy(target, source, nbytes)
            gpu.record(end)
            gpu.synchronize()
            best = min(best, gpu.elapsed_ns(start, end))
    finally:
        gpu.free(source)
        gpu.free(target)
    return BandwidthMeasured(nbytes=nbytes, best_ns=best, bytes_per_s=2 * nbytes / (best / 1e9))


_memo_lock = threading.Lock()
_memo: dict[str, HbmBandwidth] = {}


def cached_bandwidth(gpu: GpuFingerprint, cache_dir: Path | None) -> HbmBandwidth | None:
    """The bandwidth measured earlier on this GPU kind, or None (then measure and :func:`remember` it)."""
    key = gpu_key(gpu)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
    path = _path(key, cache_dir)
    try:
        record = HbmBandwidth.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return None
    if record.key != key:  # a file copied from another machine says nothing about this one
        return None
    with _memo_lock:
        _memo[key] = record
    return record


def remember(gpu: GpuFingerprint, measured: BandwidthMeasured, cache_dir: Path | None) -> HbmBandwidth:
    """Cache a measurement for this GPU kind (on disk, atomically, and in the process)."""
    key = gpu_key(gpu)
    record = HbmBandwidth(
        key=key,
        gpu=gpu.name,
        bandwidth_gbs=measured.bytes_per_s / 1e9,
        copy_bytes=measured.nbytes,
        repeats=COPY_REPEATS,
        measured_at=datetime.now(UTC),
    )
    path = _path(key, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
    tmp.write_text(record.model_dump_json(indent=1))
    tmp.replace(path)
    with _memo_lock:
        _memo[key] = record
    return record


def _path(key: str, cache_dir: Path | None) -> Path:
    return config.machine_dir(cache_dir) / f"gpu-bandwidth-{key}.json"
