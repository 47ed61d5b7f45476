"""The parameter block of ``cuLaunchKernel``: one pointer per kernel parameter, to a value of its C type.

A CUDA problem's kernel takes its parameters in PARAMS order (engine/problems.py): arrays as device pointers
(``T*``, 8 bytes), sizes as ``long long`` (8 bytes), scalars as their declared type (``float``, ``double``,
``int``, ``long long``, or a ``bfloat16``'s 16 bits). ``cuLaunchKernel`` reads a ``void*[]`` whose entry
``i`` points at parameter ``i``'s bytes, copying exactly the size the kernel's signature declares: a value
packed with the wrong width is silently misread (a ``long long`` read from a 4-byte ``int`` takes 4 bytes
of whatever follows), so the widths live here, in one table, and are checked by tests on the CPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

from engine.harness import protocol as p

# The C type of a scalar parameter, by declared dtype.
SCALAR_CTYPES: dict[str, type[ctypes._SimpleCData[Any]]] = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "int32": ctypes.c_int32,
    "int64": ctypes.c_int64,
    "bfloat16": ctypes.c_uint16,  # the 16 bits of the value, as stored (numpy uint16)
}
# Sizes are `long long` whatever dtype PARAMS declares for them, and device pointers are 64-bit.
SIZE_CTYPE = ctypes.c_longlong
POINTER_CTYPE = ctypes.c_uint64


def argument_ctype(param: p.ParamSpec) -> type[ctypes._SimpleCData[Any]]:
    """The C type parameter ``param`` is passed as."""
    if param.is_array:
        return POINTER_CTYPE
    if param.role == "size":
        return SIZE_CTYPE
    if param.dtype not in SCALAR_CTYPES:
        raise ValueError(
            f"scalar parameter {param.name!r} has dtype {param.dtype!r}, which a CUDA kernel cannot take; "
            f"use one of {sorted(SCALAR_CTYPES)}"
        )
    return SCALAR_CTYPES[param.dtype]


class KernelArguments:
    """The ``void*[]`` of one launch, and the values it points at (kept alive as long as this object)."""

    def __init__(
        self,
        params: Sequence[p.ParamSpec],
        pointers: Mapping[str, int],
        shape: Mapping[str, int],
        scalars: Mapping[str, float | int],
    ) -> None:
        """``pointers``: the device address of each array's data; ``shape``: the sizes; ``scalars``: the
        scalar arguments (a ``bfloat16`` scalar as its 16 bits)."""
        self.values: list[ctypes._SimpleCData[Any]] = []
        for param in params:
            kind = argument_ctype(param)
            if param.is_array:
                if param.name not in pointers:
                    raise ValueError(f"no device pointer for array parameter {param.name!r}")
                value: float | int = int(pointers[param.name])
            elif param.role == "size":
                source = shape if param.name in shape else scalars
                if param.name not in source:
                    raise ValueError(f"no value for size parameter {param.name!r} (shape {dict(shape)})")
                value = int(source[param.name])
            else:
                if param.name not in scalars:
                    raise ValueError(f"no value for scalar parameter {param.name!r}")
                raw = scalars[param.name]
                value = float(raw) if kind in (ctypes.c_float, ctypes.c_double) else int(raw)
            self.values.append(kind(value))
        self.block = (ctypes.c_void_p * max(1, len(self.values)))(*[ctypes.addressof(v) for v in self.values])

    @property
    def address(self) -> int:
        """The address of the ``void*[]``, as ``cuLaunchKernel``'s ``kernelParams`` takes it."""
        return ctypes.addressof(self.block)

    def sizes(self) -> list[int]:
        """Bytes of each parameter's value, in order."""
        return [ctypes.sizeof(v) for v in self.values]

    def set_pointer(self, index: int, address: int) -> None:
        """Point array parameter ``index`` at another device address (the next slot of a rotation), in place:
        the block keeps pointing at the same value object."""
        value = self.values[index]
        if not isinstance(value, POINTER_CTYPE):
            raise TypeError(f"parameter {index} is not a device pointer")
        value.value = int(address)
