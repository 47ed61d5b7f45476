"""What kernel hardware this machine has: its CPU target and any CUDA GPUs, as task-queue suffixes."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from engine.hardware import cpu_target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    """One CUDA device."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]

    @property
    def target(self) -> str:
        """The target (and queue suffix) of its architecture, e.g. `cuda-sm90`."""
        major, minor = self.compute_capability
        return f"cuda-sm{major}{minor}"


@dataclass(frozen=True)
class GpuScan:
    """What GPU detection found: the devices this process sees, or why it sees none."""

    gpus: list[Gpu] = field(default_factory=list)
    reason: str = ""
    """Why no GPU is usable, in words ('' when there are GPUs)."""


def scan_gpus() -> GpuScan:
    """CUDA devices through cuda-python's driver API (``CUDA_VISIBLE_DEVICES`` decides which are visible); no
    context is created. Never raises: a machine without cuda-python, a driver or a device gets the reason."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        return GpuScan(reason=f"cuda-python is not installed ({error})")
    try:
        (status,) = driver.cuInit(0)
    except Exception as error:  # no libcuda on this machine: cuda-python raises its own loader error
        return GpuScan(reason=f"no NVIDIA driver library on this machine ({type(error).__name__}: {error})")
    if status != driver.CUresult.CUDA_SUCCESS:
        return GpuScan(reason=f"the NVIDIA driver did not start: cuInit returned {getattr(status, 'name', status)}")
    try:
        status, count = driver.cuDeviceGetCount()
        if status != driver.CUresult.CUDA_SUCCESS or count == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return GpuScan(reason=f"the NVIDIA driver sees no CUDA device{where}")
        gpus = []
        attr = driver.CUdevice_attribute
        for ordinal in range(count):
            _, device = driver.cuDeviceGet(ordinal)
            _, raw_name = driver.cuDeviceGetName(256, device)
            _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
            _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
            name = raw_name.split(b"\0", 1)[0].decode(errors="replace")
            gpus.append(Gpu(ordinal=ordinal, name=name, compute_capability=(int(major), int(minor))))
        return GpuScan(gpus=gpus)
    except Exception as error:  # a driver that answers oddly: report it, serve the CPU
        log.debug("GPU detection failed: %s", error)
        return GpuScan(reason=f"GPU detection failed: {type(error).__name__}: {error}")


def detect_gpus() -> list[Gpu]:
    """CUDA devices through cuda-python's driver API; an empty list where there is no driver or device."""
    return scan_gpus().gpus


def local_targets() -> list[str]:
    """Every target this machine can serve: its CPU first, then one per distinct GPU architecture."""
    targets = [cpu_target()]
    for gpu in detect_gpus():
        if gpu.target not in targets:
            targets.append(gpu.target)
    return targets
