"""cuda-python's real argument checks for every driver call the judge makes, on a machine without a GPU.

cuda-python converts and checks a call's arguments before it loads the driver library: on a machine without
libcuda a call with arguments of the right types fails with the loader's error, one with a wrong type fails
with TypeError first. This module passes every call to the real ``cuda.bindings.driver``, turns the loader's
error into a plausible answer (objects of the binding's own handle types, so the next call is checked with
what a driver would have returned) and lets a TypeError through. engine/harness/cuda/device.py used with
``use_driver("cuda_argument_probe")`` thus runs every call site against the binding's own signatures.
"""

from __future__ import annotations

import itertools
from typing import Any

from cuda.bindings import driver as real

ARGUMENT_ERRORS = (TypeError, ValueError, OverflowError, AttributeError)
OK = real.CUresult.CUDA_SUCCESS
calls: list[str] = []  # every call checked, in order
_handles = itertools.count(0x1000, 0x100)
_events: dict[int, int] = {}

# What a driver would answer, by function (the status comes first, as the binding returns it).
ANSWERS: dict[str, Any] = {
    "cuInit": lambda *a: (OK,),
    "cuDeviceGetCount": lambda *a: (OK, 1),
    "cuDeviceGet": lambda *a: (OK, real.CUdevice(0)),
    "cuDevicePrimaryCtxSetFlags": lambda *a: (OK,),
    "cuDevicePrimaryCtxRetain": lambda *a: (OK, real.CUcontext(next(_handles))),
    "cuCtxSetCurrent": lambda *a: (OK,),
    "cuStreamCreate": lambda *a: (OK, real.CUstream(next(_handles))),
    "cuDeviceGetAttribute": lambda *a: (OK, 9),
    "cuDeviceGetName": lambda *a: (OK, b"probe".ljust(a[0], b"\0")),
    "cuDeviceGetUuid": lambda *a: (OK, real.CUuuid()),
    "cuDeviceTotalMem": lambda *a: (OK, 80 << 30),
    "cuMemGetInfo": lambda *a: (OK, 70 << 30, 80 << 30),
    "cuDriverGetVersion": lambda *a: (OK, 13000),
    "cuMemAlloc": lambda *a: (OK, real.CUdeviceptr(next(_handles) << 20)),
    "cuMemFree": lambda *a: (OK,),
    "cuMemcpyHtoDAsync": lambda *a: (OK,),
    "cuMemcpyDtoHAsync": lambda *a: (OK,),
    "cuMemcpyDtoDAsync": lambda *a: (OK,),
    "cuMemsetD8Async": lambda *a: (OK,),
    "cuStreamSynchronize": lambda *a: (OK,),
    "cuModuleLoadData": lambda *a: (OK, real.CUmodule(next(_handles))),
    "cuModuleGetFunction": lambda *a: (OK, real.CUfunction(next(_handles))),
    "cuFuncSetAttribute": lambda *a: (OK,),
    "cuLaunchKernel": lambda *a: (OK,),
    "cuEventCreate": lambda *a: (OK, real.CUevent(next(_handles))),
    "cuEventRecord": lambda *a: (OK,),
    "cuEventElapsedTime": lambda *a: (OK, 0.25),
    "cuGetErrorString": lambda *a: (OK, b"probe"),
}


def _checked(name: str) -> Any:
    function = getattr(real, name)

    def call(*args: Any) -> Any:
        try:
            result = function(*args)
        except ARGUMENT_ERRORS:
            raise
        except Exception:  # the loader's error: the arguments passed the binding's checks
            calls.append(name)
            return ANSWERS[name](*args)
        raise RuntimeError(f"{name} ran for real: this machine has a CUDA driver, use the GPU tests ({result})")

    return call


def __getattr__(name: str) -> Any:
    if name in ANSWERS:
        return _checked(name)
    return getattr(real, name)
