"""The CUDA driver calls the judge makes, each one checked: a failure is a :class:`CudaError` naming the call,
the CUresult code, its name and the driver's own description -- never a silent bad status.

Only the sandboxed CUDA child (engine/harness/cuda/worker.py) and the worker's GPU detection use this module;
the parent never holds a CUDA context, so a kernel that corrupts the context, traps or hangs takes down the
child, not the judge. The context is the device's *primary* context, made current on this thread: it is the
one CuPy's runtime API binds to as well, so the library baseline runs in the same context, on the same
stream, timed by the same events.

cuda-python (``cuda.bindings.driver``) returns ``(CUresult, *values)`` from every call and raises only for
arguments of the wrong Python type; :func:`check` turns the first into values or a CudaError.
"""

from __future__ import annotations

import functools
import importlib
import time
from typing import Any

import numpy as np

from engine.harness.cuda.arguments import KernelArguments
from engine.harness.cuda.messages import LaunchDims

# Static shared memory a kernel may use without opting in; above it the launch needs the function attribute.
DEFAULT_SHARED_LIMIT = 48 << 10
# The implementation of the CUDA driver API: cuda-python's bindings. CPU tests run the whole child against a
# double with the same functions (tests/cuda_driver_double.py), named in the plan.
DEFAULT_DRIVER = "cuda.bindings.driver"
# How long a child waits for a GPU in exclusive-process mode that another process still holds.
CONTEXT_WAIT_S = 30.0
_driver_name = DEFAULT_DRIVER


class CudaUnavailable(RuntimeError):
    """cuda-python or the NVIDIA driver is not there: the machine has no usable GPU (not anyone's verdict)."""


class CudaError(RuntimeError):
    """A driver call returned an error status."""

    def __init__(self, call: str, code: int, name: str, description: str) -> None:
        super().__init__(f"{call} failed with {name} ({code}): {description}")
        self.call = call
        self.code = code
        self.name = name
        self.description = description


def use_driver(name: str) -> None:
    """Make ``name`` (a module with cuda.bindings.driver's functions) the driver API of this process."""
    global _driver_name
    _driver_name = name
    driver.cache_clear()


@functools.cache
def driver() -> Any:
    """``cuda.bindings.driver`` (cuda-python 12.6 and later, 13), or the module :func:`use_driver` named,
    imported on first use."""
    try:
        return importlib.import_module(_driver_name)
    except ImportError as error:
        raise CudaUnavailable(
            f"cannot import the CUDA driver API {_driver_name!r} ({error}); pip install 'cuda-python>=12.6'"
        ) from None


def error_text(status: Any) -> tuple[str, str]:
    """The name and description of a CUresult, as the driver gives them (never raises)."""
    d = driver()
    name = getattr(status, "name", None) or f"CUresult {int(status)}"
    description = ""
    try:
        got, text = d.cuGetErrorString(status)
        if got == d.CUresult.CUDA_SUCCESS and text:
            description = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    except Exception:  # a description is a courtesy; the name and code are the evidence
        pass
    return str(name), description or "no description from the driver"


def check(result: Any, call: str) -> Any:
    """The values of a cuda-python call's ``(status, *values)``: None, the single value, or a tuple; raises
    CudaError when the status is not CUDA_SUCCESS."""
    d = driver()
    status, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if status != d.CUresult.CUDA_SUCCESS:
        name, description = error_text(status)
        raise CudaError(call, int(status), name, description)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


class Gpu:
    """One device with its primary context current on this thread, and one stream every call goes to."""

    def __init__(self, ordinal: int = 0) -> None:
        d = self.d = driver()
        self.notes: list[str] = []
        try:
            status = d.cuInit(0)
        except Exception as error:  # no libcuda.so on this machine: cuda-python raises its own loader errors
            raise CudaUnavailable(f"the NVIDIA driver library could not be loaded: {error}") from None
        try:
            check(status, "cuInit")
        except CudaError as error:  # CUDA_ERROR_NO_DEVICE, a driver older than the bindings...
            raise CudaUnavailable(str(error)) from None
        count = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if ordinal >= int(count):
            raise CudaUnavailable(
                f"no CUDA device {ordinal}: the driver sees {count} (CUDA_VISIBLE_DEVICES decides which are visible)"
            )
        self.device = check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        # Blocking synchronization: a host thread waiting for a kernel sleeps instead of spinning, so a long
        # or hung kernel does not burn the sandbox's CPU-time limit (the watchdog, not SIGXCPU, ends a hang).
        flags = int(d.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC)
        try:
            check(d.cuDevicePrimaryCtxSetFlags(self.device, flags), "cuDevicePrimaryCtxSetFlags")
        except CudaError as error:
            self.notes.append(f"blocking synchronization not set (waits may spin): {error}")
        self.context = self._retain_context()
        check(d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        # A stream of our own, not the legacy default stream: the library baseline is pointed at it too.
        self.stream = check(d.cuStreamCreate(0), "cuStreamCreate")

    def _retain_context(self) -> Any:
        """The primary context, waiting a while for a device in exclusive-process mode that is still held by
        the previous child (its context outlives a kill by the time the driver takes to tear it down)."""
        deadline = time.monotonic() + CONTEXT_WAIT_S
        while True:
            try:
                return check(self.d.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
            except CudaError as error:
                if error.name != "CUDA_ERROR_DEVICE_UNAVAILABLE" or time.monotonic() > deadline:
                    raise
                time.sleep(0.25)

    # -- device facts ------------------------------------------------------------------------------------

    def attribute(self, name: str) -> int | None:
        """A CU_DEVICE_ATTRIBUTE_<name> value, or None where this driver or binding does not have it."""
        d = self.d
        attr = getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
        if attr is None:
            return None
        try:
            return int(check(d.cuDeviceGetAttribute(attr, self.device), f"cuDeviceGetAttribute({name})"))
        except CudaError:
            return None

    def name(self) -> bytes:
        raw: bytes = check(self.d.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        return raw

    def uuid(self) -> bytes:
        try:
            value = check(self.d.cuDeviceGetUuid(self.device), "cuDeviceGetUuid")
        except (CudaError, AttributeError):
            return b""
        raw = getattr(value, "bytes", b"")
        return bytes(raw) if raw else b""

    def total_memory(self) -> int:
        return int(check(self.d.cuDeviceTotalMem(self.device), "cuDeviceTotalMem"))

    def free_memory(self) -> int:
        free, _total = check(self.d.cuMemGetInfo(), "cuMemGetInfo")
        return int(free)

    def driver_version(self) -> int:
        return int(check(self.d.cuDriverGetVersion(), "cuDriverGetVersion"))

    # -- memory --------------------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        """A device allocation of ``nbytes`` (at least 1), its address."""
        return int(check(self.d.cuMemAlloc(max(1, int(nbytes))), f"cuMemAlloc({nbytes} bytes)"))

    def free(self, address: int) -> None:
        check(self.d.cuMemFree(address), "cuMemFree")

    def upload(self, address: int, host: np.ndarray) -> None:
        """Copy a C-contiguous host array to ``address`` (queued on the stream; the host array may be
        reused at once: pageable copies are staged before the call returns)."""
        data = np.ascontiguousarray(host)
        if data.nbytes:
            check(self.d.cuMemcpyHtoDAsync(address, data.ctypes.data, data.nbytes, self.stream), "cuMemcpyHtoDAsync")

    def download(self, host: np.ndarray, address: int) -> None:
        """Copy device bytes at ``address`` into the C-contiguous ``host`` array, and wait for it."""
        if not host.flags.c_contiguous:
            raise ValueError("download needs a C-contiguous host array")
        if host.nbytes:
            check(self.d.cuMemcpyDtoHAsync(host.ctypes.data, address, host.nbytes, self.stream), "cuMemcpyDtoHAsync")
        self.synchronize("cuStreamSynchronize (after a copy to the host)")

    def copy(self, target: int, source: int, nbytes: int) -> None:
        """Device-to-device copy, queued on the stream."""
        if nbytes:
            check(self.d.cuMemcpyDtoDAsync(target, source, nbytes, self.stream), "cuMemcpyDtoDAsync")

    def fill_bytes(self, address: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` bytes to ``value`` (a write of every byte), queued on the stream."""
        if nbytes:
            check(self.d.cuMemsetD8Async(address, value & 0xFF, nbytes, self.stream), "cuMemsetD8Async")

    def synchronize(self, call: str = "cuStreamSynchronize") -> None:
        """Wait for everything queued on the stream; a kernel's fault surfaces here."""
        check(self.d.cuStreamSynchronize(self.stream), call)

    # -- modules and launches ------------------------------------------------------------------------------

    def load_module(self, image: bytes) -> Any:
        """Load a cubin (cuModuleLoadData); its own module, so contenders never share globals."""
        buffer = np.frombuffer(image, dtype=np.uint8).copy()  # a stable host address for the call
        return check(self.d.cuModuleLoadData(buffer.ctypes.data), "cuModuleLoadData")

    def function(self, module: Any, entry: str) -> Any:
        return check(self.d.cuModuleGetFunction(module, entry.encode()), f"cuModuleGetFunction({entry!r})")

    def prepare_launch(self, function: Any, launch: LaunchDims) -> None:
        """Opt the function in to more than 48 KiB of dynamic shared memory where its launch asks for it."""
        if launch.shared_bytes > DEFAULT_SHARED_LIMIT:
            attr = self.d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(
                self.d.cuFuncSetAttribute(function, attr, int(launch.shared_bytes)),
                f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={launch.shared_bytes})",
            )

    def launch(self, function: Any, launch: LaunchDims, arguments: KernelArguments) -> None:
        """Queue one launch on the stream (asynchronous: faults surface at the next synchronization)."""
        (gx, gy, gz), (bx, by, bz) = launch.grid, launch.block
        check(
            self.d.cuLaunchKernel(
                function, gx, gy, gz, bx, by, bz, int(launch.shared_bytes), self.stream, arguments.address, 0
            ),
            "cuLaunchKernel",
        )

    # -- events ------------------------------------------------------------------------------------------

    def event(self) -> Any:
        """An event with timing enabled that a waiting host thread sleeps on."""
        return check(self.d.cuEventCreate(int(self.d.CUevent_flags.CU_EVENT_BLOCKING_SYNC)), "cuEventCreate")

    def record(self, event: Any) -> None:
        check(self.d.cuEventRecord(event, self.stream), "cuEventRecord")

    def elapsed_ns(self, start: Any, end: Any) -> float:
        """Device time between two recorded, completed events, nanoseconds (resolution about 0.5 us)."""
        return float(check(self.d.cuEventElapsedTime(start, end), "cuEventElapsedTime")) * 1e6

    def stream_handle(self) -> int:
        """The stream as an integer handle (for CuPy's ExternalStream)."""
        return int(self.stream)
