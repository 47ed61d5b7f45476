"""Where a trial's arrays sit in device memory: each inside a guarded region, outputs poisoned before the call.

A region is one device allocation ``guard | data | guard``. The parent (engine/harness/validation.py) picks a
random guard pattern per run; the child writes it into both guards, copies the inputs into their data,
fills each output with a NaN pattern, launches the kernel, and copies every whole region back to the parent,
which checks the guards byte for byte, the inputs for changes and the outputs against the reference. A
kernel writing before the start or past the end of an array changes a guard (or, further off, faults on an
unmapped address: a crash verdict); one that leaves an output unwritten leaves NaN there.

GPU guards are larger than the CPU harness's: an out-of-bounds index on a GPU is typically off by a whole
block or row (kilobytes), not by a few elements. The data starts at an offset that keeps the allocation's
256-byte alignment, so vector loads (``float4``) and TMA-style accesses see the alignment ``cudaMalloc`` gives.

The poison patterns are quiet NaNs with two different payloads (per dtype, bfloat16 included), so a kernel
that reads its output before writing it, or leaves part of it alone, gives different bits on two identical
calls (the repeated-call check). Integer outputs get a byte pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.problems import DTYPES

# Bytes of guard before and after every array on the GPU (a multiple of ALIGNMENT).
GPU_GUARD_BYTES = 64 << 10
# cuMemAlloc returns 256-byte aligned addresses; the data inside a region keeps that alignment.
ALIGNMENT = 256
# Output pre-fills by element size in bytes: (variant 0, variant 1), quiet NaNs with different payloads.
NAN_PATTERNS = {
    2: (0x7FC0, 0x7FDE),  # bfloat16: sign 0, exponent all ones, top mantissa bit set
    4: (0x7FC00000, 0x7FC0DEAD),  # float32
    8: (0x7FF8000000000000, 0x7FF800000000BEEF),  # float64
}
# Byte pre-fills of integer outputs (no NaN to use): variant 0, variant 1.
INTEGER_POISON_BYTES = (0xA5, 0x5A)
BFLOAT16 = "bfloat16"


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype an element of the declared ``dtype`` is stored as (``bfloat16``: its 16 bits, uint16)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown element type {dtype!r}; expected one of {list(DTYPES)}")
    return np.dtype(DTYPES[dtype])


def is_floating(dtype: str) -> bool:
    """True for the declared float types (float32, float64, bfloat16): their outputs are pre-filled with NaN."""
    return dtype == BFLOAT16 or storage_dtype(dtype).kind == "f"


@dataclass(frozen=True)
class RegionLayout:
    """One array's region: ``guard`` bytes, the ``nbytes`` of data, ``guard`` bytes, in one allocation."""

    nbytes: int
    guard: int

    def __post_init__(self) -> None:
        if self.guard <= 0 or self.guard % ALIGNMENT:
            raise ValueError(f"guard must be a positive multiple of {ALIGNMENT} bytes; got {self.guard}")
        if self.nbytes < 0:
            raise ValueError(f"an array cannot have {self.nbytes} bytes")

    @property
    def data_offset(self) -> int:
        """Where the data starts: right after the leading guard (so 256-byte aligned)."""
        return self.guard

    @property
    def after_offset(self) -> int:
        """Where the trailing guard starts: right after the last data byte, so the first byte past the end
        is guarded."""
        return self.guard + self.nbytes

    @property
    def total(self) -> int:
        """Bytes of the whole allocation."""
        return self.guard + self.nbytes + self.guard


def array_nbytes(dims: tuple[int, ...] | list[int], dtype: str) -> int:
    """Bytes of an array of ``dims`` elements of ``dtype``."""
    count = int(np.prod(dims, dtype=np.int64)) if len(dims) else 1
    return count * storage_dtype(dtype).itemsize


def region_layout(dims: tuple[int, ...] | list[int], dtype: str, guard: int = GPU_GUARD_BYTES) -> RegionLayout:
    """The region of an array of ``dims`` elements of ``dtype``."""
    return RegionLayout(nbytes=array_nbytes(dims, dtype), guard=guard)


def poison_fill(dtype: str, count: int, variant: int = 0) -> np.ndarray:
    """``count`` elements of the output pre-fill for ``dtype`` (host memory, to copy to the device)."""
    storage = storage_dtype(dtype)
    if is_floating(dtype):
        bits = NAN_PATTERNS[storage.itemsize][variant % 2]
        return np.full(count, bits, dtype=f"<u{storage.itemsize}")
    return np.full(count * storage.itemsize, INTEGER_POISON_BYTES[variant % 2], dtype=np.uint8)


def guarded_image(layout: RegionLayout, guard: bytes, data: bytes | memoryview | np.ndarray) -> np.ndarray:
    """The bytes of a whole region as the child writes it: guard, ``data`` (exactly ``layout.nbytes``), guard."""
    if len(guard) != layout.guard:
        raise ValueError(f"the guard pattern has {len(guard)} bytes; the layout wants {layout.guard}")
    body = data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if body.size != layout.nbytes:
        raise ValueError(f"the data has {body.size} bytes; the layout wants {layout.nbytes}")
    image = np.empty(layout.total, dtype=np.uint8)
    pattern = np.frombuffer(guard, dtype=np.uint8)
    image[: layout.data_offset] = pattern
    image[layout.data_offset : layout.after_offset] = body
    image[layout.after_offset :] = pattern
    return image
