"""A CPU double of the few CuPy names the CUDA child uses for the library baseline (engine/harness/cuda/worker.py
LibraryCall), over the driver double's "device" memory, which is host memory (tests/cuda_driver_double.py):
an array on an unowned pointer is a numpy view of it, so a problem's ``cuda_baseline`` written with array
operators runs on numpy. The CUDA child imports it when its plan names it (``library_module``).
"""

from __future__ import annotations

import ctypes
import math
from types import SimpleNamespace
from typing import Any

import numpy as np

float32 = np.float32
float64 = np.float64


class _Device:
    def __init__(self, ordinal: int = 0) -> None:
        self.ordinal = ordinal

    def use(self) -> None:
        pass


class _ExternalStream:
    def __init__(self, pointer: int, device_id: int = -1) -> None:
        self.pointer = pointer

    def __enter__(self) -> _ExternalStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _UnownedMemory:
    def __init__(self, pointer: int, size: int, owner: object, device_id: int = -1) -> None:
        self.ptr, self.size, self.owner = int(pointer), int(size), owner


class _MemoryPointer:
    def __init__(self, memory: _UnownedMemory, offset: int) -> None:
        self.ptr = memory.ptr + offset
        self.memory = memory


cuda = SimpleNamespace(
    Device=_Device, ExternalStream=_ExternalStream, UnownedMemory=_UnownedMemory, MemoryPointer=_MemoryPointer
)


def ndarray(shape: Any, dtype: Any = np.float64, memptr: _MemoryPointer | None = None) -> np.ndarray:
    dims = tuple(int(d) for d in (shape if isinstance(shape, list | tuple) else (shape,)))
    dtype = np.dtype(dtype)
    if memptr is None:
        return np.empty(dims, dtype=dtype)
    raw = (ctypes.c_uint8 * (math.prod(dims) * dtype.itemsize)).from_address(memptr.ptr)
    return np.frombuffer(memoryview(raw), dtype=dtype).reshape(dims)
