"""Which GPU a measurement ran on: its :class:`~engine.hardware.GpuFingerprint`, read through the driver API.

Read in the sandboxed CUDA child (:func:`read_gpu_fingerprint`), which owns the context; the parsing of what
the driver and /proc hand back is pure and lives in small functions the CPU tests cover. :func:`gpu_key` is
the short key measured figures of a GPU (its HBM bandwidth) are cached under: two devices with the same key
are the same model, driver, memory and clocks, so one measurement serves both.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from engine.hardware import GpuFingerprint

if TYPE_CHECKING:
    from engine.harness.cuda.device import Gpu

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu ..." or, for the open kernel modules,
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build ...".
_DRIVER_RELEASE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


def cuda_version_text(version: int) -> str:
    """cuDriverGetVersion's integer as ``major.minor``: 12080 is '12.8', 13000 is '13.0'."""
    if version <= 0:
        return "unknown"
    return f"{version // 1000}.{(version % 1000) // 10}"


def driver_release(text: str) -> str:
    """The NVIDIA driver release in /proc/driver/nvidia/version's text (e.g. '570.86.15'); '' if absent."""
    match = _DRIVER_RELEASE.search(text)
    return match.group(1) if match else ""


def device_name(raw: bytes) -> str:
    """cuDeviceGetName's buffer as text: up to the first NUL."""
    return raw.split(b"\0", 1)[0].decode(errors="replace").strip()


def uuid_text(raw: bytes) -> str:
    """A CUuuid's 16 bytes as nvidia-smi prints them: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx ('' if not 16)."""
    if len(raw) != 16:
        return ""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def gpu_key(gpu: GpuFingerprint) -> str:
    """A short stable key for caching measurements of this kind of GPU (model, driver, memory, clocks)."""
    text = "|".join(
        str(part)
        for part in (
            gpu.name,
            gpu.compute_capability,
            gpu.sm_count,
            gpu.driver_version,
            gpu.cuda_version,
            gpu.memory_bytes,
            gpu.l2_bytes,
            gpu.sm_clock_khz,
            gpu.memory_clock_khz,
            gpu.memory_bus_bits,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def theoretical_bandwidth_gbs(gpu: GpuFingerprint) -> float | None:
    """The memory's peak from its clock and bus width (double data rate), GB/s: a sanity figure printed next
    to the measured bandwidth, never used as the roofline (drivers report these clocks loosely)."""
    if not gpu.memory_clock_khz or not gpu.memory_bus_bits:
        return None
    return 2 * gpu.memory_clock_khz * 1e3 * gpu.memory_bus_bits / 8 / 1e9


def read_gpu_fingerprint(gpu: Gpu) -> GpuFingerprint:
    """Describe the device ``gpu`` holds (run in the CUDA child)."""
    try:
        release = driver_release(DRIVER_VERSION_FILE.read_text())
    except OSError:
        release = ""
    try:
        from cuda.bindings import __version__ as bindings
    except ImportError:
        bindings = ""
    major = gpu.attribute("COMPUTE_CAPABILITY_MAJOR") or 0
    minor = gpu.attribute("COMPUTE_CAPABILITY_MINOR") or 0
    return GpuFingerprint(
        name=device_name(gpu.name()),
        uuid=uuid_text(gpu.uuid()),
        compute_capability=f"{major}.{minor}",
        sm_count=gpu.attribute("MULTIPROCESSOR_COUNT") or 0,
        driver_version=release,
        cuda_version=cuda_version_text(gpu.driver_version()),
        bindings_version=str(bindings),
        sm_clock_khz=gpu.attribute("CLOCK_RATE"),
        memory_clock_khz=gpu.attribute("MEMORY_CLOCK_RATE"),
        memory_bus_bits=gpu.attribute("GLOBAL_MEMORY_BUS_WIDTH"),
        memory_bytes=gpu.total_memory(),
        l2_bytes=gpu.attribute("L2_CACHE_SIZE") or 0,
    )
