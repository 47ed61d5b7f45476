"""A CPU double of the CUDA driver API (the subset of ``cuda.bindings.driver`` engine/harness/cuda/device.py
calls), so the whole CUDA judge -- sandboxed child, guarded regions, launches, event-timed rounds, verdicts --
runs in the CPU tests. The CUDA child imports it when its plan names it (``driver_module``).

"Device memory" is host memory (every address is a real one, so the harness's copies and the kernel's
parameter block work as on a GPU), a "cubin" is a JSON document ending with a NUL byte that says which
behaviour the "kernel" has, and a launch runs the problem's float64 reference in Python on the arrays its
parameter block points at:

- ``correct``: writes the reference, rounded to the output dtype (bfloat16 to its bits);
- ``wrong``: writes the reference plus one;
- ``out_of_bounds``: writes the reference, then 4 bytes past the end of its first output;
- ``hang``: the next synchronization never returns (the parent's watchdog must end it);
- ``fault``: the next synchronization fails with CUDA_ERROR_ILLEGAL_ADDRESS, and so does every call after it;
- ``refused``: the launch fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
- ``memoizes_by_buffer``: remembers its first answer for each set of input buffers and, on later launches on
  the same buffers, writes that answer back with only its first element computed afresh (a kernel that bets
  the harness's drift only ever changes element 0);
- ``reuses_work``: right every time, but does its work (a sleep of REUSED_WORK_S) only on inputs it has not
  seen: on buffers whose content differs from what it saw there last in at most a few elements (the judge's
  drift) it "patches" its answer at no cost (a kernel that reads its inputs to find what changed and updates
  what it computed before).

Events read the host clock when recorded (work runs when it is queued), so timings are real, if slow.
"""

from __future__ import annotations

import ctypes
import json
import time
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np


class CUresult(IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701


class CUctx_flags(IntEnum):
    CU_CTX_SCHED_BLOCKING_SYNC = 4


class CUevent_flags(IntEnum):
    CU_EVENT_DEFAULT = 0
    CU_EVENT_BLOCKING_SYNC = 1


class CUfunction_attribute(IntEnum):
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CUdevice_attribute(IntEnum):
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


ATTRIBUTES = {
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE: 1_500_000,
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 4,
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: 1_000_000,
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: 256,
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: 1 << 20,
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
}
TOTAL_MEMORY = 8 << 30
OK = CUresult.CUDA_SUCCESS
_STORAGE = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "bfloat16": np.uint16}
_SCALARS: dict[str, Any] = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "int64": ctypes.c_int64,
    "int32": ctypes.c_int32,
    "bfloat16": ctypes.c_uint16,
}


class CUuuid:
    bytes = bytes(range(16))


class _State:
    def __init__(self) -> None:
        self.memory: dict[int, Any] = {}
        self.sticky: CUresult | None = None
        self.pending: str | None = None  # what the next synchronization does: "hang" or "fault"
        self.events: dict[int, int] = {}
        self.next_handle = 1


STATE = _State()


def _ok(*values: Any) -> tuple[Any, ...]:
    if STATE.sticky is not None:
        return (STATE.sticky, *([None] * len(values)))
    return (OK, *values)


def _handle() -> int:
    STATE.next_handle += 1
    return STATE.next_handle


# -- initialisation and device facts -------------------------------------------------------------------------


def cuInit(flags: int) -> tuple[Any, ...]:
    return (OK,)


def cuDeviceGetCount() -> tuple[Any, ...]:
    return (OK, 1)


def cuDeviceGet(ordinal: int) -> tuple[Any, ...]:
    return (OK, 0) if ordinal == 0 else (CUresult.CUDA_ERROR_INVALID_VALUE, None)


def cuDevicePrimaryCtxSetFlags(device: int, flags: int) -> tuple[Any, ...]:
    return (OK,)


def cuDevicePrimaryCtxRetain(device: int) -> tuple[Any, ...]:
    return (OK, _handle())


def cuCtxSetCurrent(context: int) -> tuple[Any, ...]:
    return (OK,)


def cuStreamCreate(flags: int) -> tuple[Any, ...]:
    return (OK, _handle())


def cuDeviceGetAttribute(attribute: Any, device: int) -> tuple[Any, ...]:
    return (OK, ATTRIBUTES[CUdevice_attribute(int(attribute))])


def cuDeviceGetName(length: int, device: int) -> tuple[Any, ...]:
    return (OK, b"Kernel Factory CPU double".ljust(length, b"\0"))


def cuDeviceGetUuid(device: int) -> tuple[Any, ...]:
    return (OK, CUuuid())


def cuDeviceTotalMem(device: int) -> tuple[Any, ...]:
    return (OK, TOTAL_MEMORY)


def cuMemGetInfo() -> tuple[Any, ...]:
    used = sum(len(buffer) for buffer in STATE.memory.values())
    return (OK, TOTAL_MEMORY - used, TOTAL_MEMORY)


def cuDriverGetVersion() -> tuple[Any, ...]:
    return (OK, 13000)


def cuGetErrorString(status: Any) -> tuple[Any, ...]:
    return (OK, f"the CPU double's {CUresult(int(status)).name}".encode())


# -- memory ------------------------------------------------------------------------------------------------


def cuMemAlloc(nbytes: int) -> tuple[Any, ...]:
    if STATE.sticky is not None:
        return (STATE.sticky, None)
    buffer = ctypes.create_string_buffer(int(nbytes))
    address = ctypes.addressof(buffer)
    STATE.memory[address] = buffer
    return (OK, address)


def cuMemFree(address: int) -> tuple[Any, ...]:
    STATE.memory.pop(int(address), None)
    return _ok()


def cuMemcpyHtoDAsync(target: int, source: int, nbytes: int, stream: Any) -> tuple[Any, ...]:
    if STATE.sticky is None:
        ctypes.memmove(int(target), int(source), int(nbytes))
    return _ok()


def cuMemcpyDtoHAsync(target: int, source: int, nbytes: int, stream: Any) -> tuple[Any, ...]:
    if STATE.sticky is None:
        ctypes.memmove(int(target), int(source), int(nbytes))
    return _ok()


def cuMemcpyDtoDAsync(target: int, source: int, nbytes: int, stream: Any) -> tuple[Any, ...]:
    if STATE.sticky is None:
        ctypes.memmove(int(target), int(source), int(nbytes))
    return _ok()


def cuMemsetD8Async(address: int, value: int, nbytes: int, stream: Any) -> tuple[Any, ...]:
    if STATE.sticky is None:
        ctypes.memset(int(address), int(value), int(nbytes))
    return _ok()


def cuStreamSynchronize(stream: Any) -> tuple[Any, ...]:
    if STATE.pending == "hang":
        while True:  # a kernel that never finishes: only the parent's watchdog ends this
            time.sleep(3600)
    if STATE.pending == "fault":
        STATE.sticky = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    return _ok()


# -- modules and launches ------------------------------------------------------------------------------------


REUSED_WORK_S = 0.03
"""The work a ``reuses_work`` kernel does on inputs it has not seen (far more than the reference takes here)."""

PATCHED_ELEMENTS = 4
"""Most changed input elements a ``reuses_work`` kernel patches its last answer for instead of working."""


class _Kernel:
    def __init__(self, document: dict[str, Any]) -> None:
        self.behaviour = str(document["behaviour"])
        self.params = document["params"]
        self.folder = document["problem_folder"]
        self.problem: Any = None
        self.max_shared = 48 * 1024  # the driver's default; cuFuncSetAttribute sets it, the last value wins
        self.memo: dict[tuple[Any, ...], Any] = {}  # memoizes_by_buffer: (output, shape, input buffers) -> answer
        self.seen: dict[tuple[Any, ...], dict[str, Any]] = {}  # reuses_work: (shape, input buffers) -> inputs

    def run(self, block: int) -> None:
        if self.problem is None:
            from engine.problems import float32_to_bf16, load_problem

            self.problem = load_problem(self.folder).for_backend("cuda")
            self.to_bf16 = float32_to_bf16
        pointers = (ctypes.c_void_p * len(self.params)).from_address(block)
        values: dict[str, Any] = {}
        for param, pointer in zip(self.params, pointers, strict=True):
            if param["role"] in ("in", "out", "inout"):
                values[param["name"]] = ctypes.c_uint64.from_address(pointer).value
            elif param["role"] == "size":
                values[param["name"]] = ctypes.c_longlong.from_address(pointer).value
            else:
                values[param["name"]] = _SCALARS[param["dtype"]].from_address(pointer).value
        shape = {p["name"]: values[p["name"]] for p in self.params if p["role"] == "size"}
        arrays = {}
        for param in self.params:
            if param["role"] in ("in", "out", "inout"):
                dims = [shape[d] for d in param["shape"]]
                dtype = np.dtype(_STORAGE[param["dtype"]])
                count = int(np.prod(dims))
                raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(values[param["name"]])
                arrays[param["name"]] = np.frombuffer(memoryview(raw), dtype=dtype).reshape(dims)
        inputs = {p["name"]: arrays[p["name"]].copy() for p in self.params if p["role"] in ("in", "inout")}
        inputs |= {p["name"]: values[p["name"]] for p in self.params if p["role"] == "scalar"}
        reference = self.problem.reference(inputs, shape)
        if self.behaviour == "reuses_work":
            buffers = (*sorted(shape.items()), *(values[p["name"]] for p in self.params if p["role"] == "in"))
            before = self.seen.get(buffers)
            changed = (
                sum(int(np.count_nonzero(before[name] != inputs[name])) for name in before)
                if before is not None
                else None
            )
            if changed is None or changed > PATCHED_ELEMENTS:
                time.sleep(REUSED_WORK_S)
            self.seen[buffers] = {p["name"]: arrays[p["name"]].copy() for p in self.params if p["role"] == "in"}
        for param in self.params:
            if param["role"] not in ("out", "inout"):
                continue
            result = np.asarray(reference[param["name"]], dtype=np.float64)
            if self.behaviour == "wrong":
                result = result + 1.0
            if self.behaviour == "memoizes_by_buffer":
                buffers = (values[p["name"]] for p in self.params if p["role"] == "in")
                key = (param["name"], *sorted(shape.items()), *buffers)
                if key in self.memo:
                    fresh = result.reshape(-1)[0]
                    result = self.memo[key].copy()
                    result.reshape(-1)[0] = fresh
                else:
                    self.memo[key] = result.copy()
            target = arrays[param["name"]]
            if param["dtype"] == "bfloat16":
                target[...] = self.to_bf16(result.astype(np.float32)).reshape(target.shape)
            else:
                target[...] = result.astype(target.dtype).reshape(target.shape)
        if self.behaviour == "out_of_bounds":
            first = next(p for p in self.params if p["role"] in ("out", "inout"))
            end = values[first["name"]] + arrays[first["name"]].nbytes
            ctypes.memset(end, 0x42, 4)


def cuModuleLoadData(image: int) -> tuple[Any, ...]:
    if STATE.sticky is not None:
        return (STATE.sticky, None)
    try:
        document = json.loads(ctypes.string_at(int(image)).decode())
    except ValueError:
        return (CUresult.CUDA_ERROR_INVALID_IMAGE, None)
    return (OK, _Kernel(document))


def cuModuleGetFunction(module: _Kernel, name: bytes) -> tuple[Any, ...]:
    return (OK, module)


def cuFuncSetAttribute(function: _Kernel, attribute: Any, value: int) -> tuple[Any, ...]:
    if int(attribute) == CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        function.max_shared = int(value)
    return _ok()


def cuLaunchKernel(
    function: _Kernel,
    gx: int,
    gy: int,
    gz: int,
    bx: int,
    by: int,
    bz: int,
    shared: int,
    stream: Any,
    params: int,
    extra: Any,
) -> tuple[Any, ...]:
    if STATE.sticky is not None:
        return (STATE.sticky,)
    if function.behaviour == "refused" or bx * by * bz > 1024:
        return (CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,)
    if shared > function.max_shared:  # as the driver: more dynamic shared memory than the function allows
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)
    if function.behaviour in ("hang", "fault"):
        STATE.pending = function.behaviour
        return (OK,)
    function.run(int(params))
    return (OK,)


# -- events ------------------------------------------------------------------------------------------------


def cuEventCreate(flags: int) -> tuple[Any, ...]:
    return (OK, _handle())


def cuEventRecord(event: int, stream: Any) -> tuple[Any, ...]:
    STATE.events[event] = time.perf_counter_ns()
    return _ok()


def cuEventElapsedTime(start: int, end: int) -> tuple[Any, ...]:
    return _ok((STATE.events[end] - STATE.events[start]) / 1e6)


# -- making artifacts --------------------------------------------------------------------------------------


def double_cubin(problem: Any, behaviour: str) -> bytes:
    """The "cubin" of a kernel of ``behaviour`` for ``problem`` (its CUDA view)."""
    params = [{"name": p.name, "role": p.role, "dtype": p.dtype, "shape": list(p.shape)} for p in problem.params]
    document = {"behaviour": behaviour, "params": params, "problem_folder": str(Path(problem.folder))}
    return json.dumps(document).encode() + b"\0"
