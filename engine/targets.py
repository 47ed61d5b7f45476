"""What kernel hardware this machine has: its CPU target and any CUDA GPUs, as task-queue suffixes."""

from __future__ import annotations

import logging
from dataclasses import dataclass

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


def detect_gpus() -> list[Gpu]:
    """CUDA devices through cuda-python's driver API; an empty list where there is no driver or device."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return []
    try:
        (status,) = driver.cuInit(0)
        if status != driver.CUresult.CUDA_SUCCESS:
            return []
        status, count = driver.cuDeviceGetCount()
        gpus = []
        for ordinal in range(count if status == driver.CUresult.CUDA_SUCCESS else 0):
            _, device = driver.cuDeviceGet(ordinal)
            _, raw_name = driver.cuDeviceGetName(64, device)
            attr = driver.CUdevice_attribute
            _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
            _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
            name = raw_name.split(b"\0", 1)[0].decode(errors="replace")
            gpus.append(Gpu(ordinal=ordinal, name=name, compute_capability=(int(major), int(minor))))
        return gpus
    except Exception as error:  # no libcuda (a CPU-only machine) is the common case, not a failure
        log.debug("no CUDA driver: %s", error)
        return []


def local_targets() -> list[str]:
    """Every target this machine can serve: its CPU first, then one per distinct GPU architecture."""
    targets = [cpu_target()]
    for gpu in detect_gpus():
        if gpu.target not in targets:
            targets.append(gpu.target)
    return targets
