"""What machine a kernel runs on: the fingerprint recorded with every measurement, and the CPU target.

A speedup is only meaningful next to the hardware it was measured on, so every benchmark report carries a
:class:`HardwareFingerprint`. :func:`cpu_target` names the worker's CPU kind (``cpu-x86_64-avx512``…); it is
the suffix of the task queue a worker polls. The measured limits used by the roofline check (memory
bandwidth, peak flops) are :class:`MachineLimits`, measured in the sandbox by ``engine.harness.benchmarking``.
A CUDA measurement adds the device's :class:`GpuFingerprint` (read by engine/harness/cuda/fingerprint.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

# The ISA features a kernel author (or a compiler flag) can exploit; the fingerprint lists only these, so
# it stays short and two machines that differ only in irrelevant flags compare equal.
RELEVANT_ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512dq",
    "avx512cd",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx512ifma",
    "avx512vbmi",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "asimdhp",
    "asimddp",
    "sve",
    "sve2",
    "sme",
)


class GpuFingerprint(BaseModel):
    """The CUDA device a measurement was taken on (engine/harness/cuda/fingerprint.py reads it in the sandboxed
    child, through the driver API)."""

    name: str = Field(description="Device name as the driver reports it, e.g. 'NVIDIA H200'.")
    uuid: str = Field(default="", description="The device's UUID (GPU-xxxxxxxx-...), when readable.")
    compute_capability: str = Field(description="Compute capability, e.g. '9.0'.")
    sm_count: int = Field(description="Streaming multiprocessors.")
    driver_version: str = Field(
        default="", description="NVIDIA driver release (e.g. '570.86.15', /proc/driver/nvidia/version); '' unknown."
    )
    cuda_version: str = Field(description="CUDA version the driver supports (cuDriverGetVersion), e.g. '12.8'.")
    bindings_version: str = Field(default="", description="cuda-python (cuda.bindings) version of the judge.")
    sm_clock_khz: int | None = Field(default=None, description="Peak SM clock, kHz (None where not reported).")
    memory_clock_khz: int | None = Field(default=None, description="Peak memory clock, kHz (None where not reported).")
    memory_bus_bits: int | None = Field(default=None, description="Memory bus width in bits (None where not reported).")
    memory_bytes: int = Field(description="Device memory, bytes.")
    l2_bytes: int = Field(description="L2 cache size, bytes (the L2 flush between timed calls writes twice this).")
    hbm_bandwidth_gbs: float | None = Field(
        default=None, description="Measured device-memory bandwidth (a large device-to-device copy), GB/s."
    )


class HardwareFingerprint(BaseModel):
    """The machine, toolchain and core budget a measurement was taken with."""

    cpu_model: str = Field(description="CPU model name as the kernel reports it (/proc/cpuinfo).")
    arch: str = Field(description="Machine architecture, e.g. x86_64 or aarch64.")
    isa_flags: list[str] = Field(description="The relevant ISA extensions present, e.g. avx2, avx512f.")
    cores_total: int = Field(description="Logical CPUs online on the machine.")
    cores_used: int = Field(description="Cores the kernel was allowed to use (the thread budget).")
    cpus: list[int] = Field(default_factory=list, description="Ids of the CPUs the kernel was pinned to.")
    compiler: str = Field(description="The C compiler's version line, e.g. 'cc (Debian 12.2.0-14) 12.2.0'.")
    governor: str | None = Field(default=None, description="cpufreq scaling governor, when readable.")
    kernel: str = Field(description="Operating system kernel release (uname -r).")
    llc_bytes: int | None = Field(default=None, description="Last-level cache size in bytes, when readable.")
    memory_bandwidth_gbs: float | None = Field(
        default=None, description="Measured streaming memory bandwidth in GB/s, when measured."
    )
    peak_gflops: float | None = Field(
        default=None, description="Measured float32 peak (BLAS sgemm) in GFLOP/s, when measured."
    )
    gpu: GpuFingerprint | None = Field(
        default=None, description="The GPU a CUDA measurement ran on (None for a CPU measurement)."
    )


class MachineLimits(BaseModel):
    """Measured physical limits of this machine for a thread budget: the roofline's denominators."""

    key: str = Field(description="Hardware key the measurement belongs to (model, ISA, threads).")
    threads: int = Field(description="Thread budget the limits were measured with.")
    dram_bandwidth_gbs: float = Field(
        description=(
            "Streaming bandwidth in the roofline model's currency (bytes read + bytes written, per second): the "
            "best of a pure read stream and a copy counted as two streams, on a working set of stream_bytes."
        )
    )
    cache_bandwidth_gbs: float = Field(description="Copy bandwidth (read + write) on a working set that fits in L2.")
    peak_gflops: float = Field(description="float32 matrix-multiply rate (BLAS sgemm), GFLOP/s.")
    llc_bytes: int = Field(description="Last-level cache size used to choose between the bandwidths.")
    stream_bytes: int = Field(
        default=256 << 20, description="Working set of the streaming measurement (the largest benchmark pool)."
    )
    estimator: str = Field(
        default="copy-3-streams/v1",
        description="How dram_bandwidth_gbs was measured; limits measured another way are measured again.",
    )


def c_compiler() -> str:
    """The C compiler used for candidates: ``$CC`` when set, else ``cc``."""
    return os.environ.get("CC") or "cc"


@functools.lru_cache(maxsize=8)
def _compiler_version(compiler: str) -> str:
    path = shutil.which(compiler)
    if path is None:
        return f"{compiler} (not found)"
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{compiler} (version unknown: {error})"
    lines = run.stdout.strip().splitlines()
    return lines[0] if lines else f"{compiler} (version unknown)"


def compiler_version() -> str:
    """First line of ``$CC --version``: part of every artifact's content hash and of the fingerprint."""
    return _compiler_version(c_compiler())


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and model in ("", platform.machine(), platform.processor()):
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def llc_bytes() -> int | None:
    """Size of the largest cache level CPU 0 sees (sysfs), in bytes."""
    best: int | None = None
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        size = _read(str(index / "size"))
        if not size:
            continue
        scale = {"K": 1024, "M": 1024 * 1024, "G": 1024**3}.get(size[-1], 1)
        digits = size[:-1] if size[-1] in "KMG" else size
        if digits.isdigit():
            best = max(best or 0, int(digits) * scale)
    return best


def isa_flags() -> list[str]:
    """The relevant ISA extensions of this CPU, in a stable order."""
    _, flags = _cpuinfo()
    return [f for f in RELEVANT_ISA_FLAGS if f in flags]


def cpu_target() -> str:
    """This worker's CPU target, the suffix of its task queue: e.g. ``cpu-x86_64-avx512``.

    Two workers with the same target run the same compiled artifacts at comparable speed (same vector ISA);
    a search for ``cpu`` is resolved to the target of the worker that answers first.
    """
    arch = platform.machine().lower()
    flags = set(isa_flags())
    if arch in ("x86_64", "amd64"):
        if {"avx512f", "avx512bw", "avx512vl"} <= flags:
            return "cpu-x86_64-avx512"
        if {"avx2", "fma"} <= flags:
            return "cpu-x86_64-avx2"
        return "cpu-x86_64"
    if arch in ("aarch64", "arm64"):
        if "sve" in flags:
            return "cpu-aarch64-sve"
        return "cpu-aarch64-neon"
    return f"cpu-{arch}"


def pinned_cpus(threads: int) -> list[int]:
    """The CPUs a kernel with this thread budget is pinned to: the last ``threads`` CPUs this process may
    use (CPU 0 usually takes the most interrupts). Raises ValueError when the budget exceeds them."""
    allowed = sorted(os.sched_getaffinity(0))
    if threads < 1 or threads > len(allowed):
        raise ValueError(f"threads={threads}: this process may use {len(allowed)} CPUs ({allowed})")
    return allowed[-threads:]


def hardware_fingerprint(threads: int = 1) -> HardwareFingerprint:
    """Describe this machine for a kernel allowed ``threads`` cores (cheap: reads /proc and sysfs)."""
    model, _ = _cpuinfo()
    try:
        cpus = pinned_cpus(threads)
    except ValueError:
        cpus = []
    return HardwareFingerprint(
        cpu_model=model,
        arch=platform.machine(),
        isa_flags=isa_flags(),
        cores_total=os.cpu_count() or 1,
        cores_used=threads,
        cpus=cpus,
        compiler=compiler_version(),
        governor=_read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        kernel=platform.release(),
        llc_bytes=llc_bytes(),
    )


def hardware_key(fingerprint: HardwareFingerprint) -> str:
    """A short stable key for caching measurements of this machine (model, ISA, cores, kernel)."""
    text = "|".join(
        [
            fingerprint.cpu_model,
            fingerprint.arch,
            ",".join(fingerprint.isa_flags),
            str(fingerprint.cores_total),
            str(fingerprint.cores_used),
            fingerprint.kernel,
            str(fingerprint.llc_bytes),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def machine_key(fingerprint: Mapping[str, Any]) -> str:
    """The machine a reading was taken on, as the lessons tell machines apart: the host's hardware key and, for
    a GPU target, the devices that serve it (a backend's ``fingerprint()``). Two machines of one kind share it;
    a new CPU model, core count, kernel release or GPU makes another, whose readings settle nothing the old one
    measured (engine/proposers/setting_evidence.py settled_candidates)."""
    host = hardware_key(HardwareFingerprint.model_validate(dict(fingerprint)))
    devices = sorted(str(device) for device in fingerprint.get("devices") or [])
    if not devices:
        return host
    return hashlib.sha256("|".join([host, *devices]).encode()).hexdigest()[:16]
