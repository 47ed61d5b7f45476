"""What ptxas said about a kernel it compiled: registers, spills, shared memory, stack -- compile evidence.

NVRTC runs ptxas with ``-v`` (engine/harness/cuda/compile.py) and its log holds, per entry function::

    ptxas info    : Compiling entry function 'softmax' for 'sm_90'
    ptxas info    : Function properties for softmax
    ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 32 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]

:func:`parse_ptxas` reads the entry's lines into a :class:`PtxasReport`, recorded in the compile result: the
launch check needs its registers and static shared memory, and a lesson such as "UNROLL=8 spills" needs its
spill bytes.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

_COMPILING = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"Used (?P<registers>\d+) registers")
_BARRIERS = re.compile(r"used (?P<barriers>\d+) barriers")
_SMEM = re.compile(r"(?P<bytes>\d+) bytes smem")
_CMEM = re.compile(r"(?P<bytes>\d+) bytes cmem\[\d+\]")


class PtxasReport(BaseModel):
    """ptxas's resource report of a kernel's entry function, for one architecture."""

    model_config = ConfigDict(frozen=True)

    arch: str = Field(default="", description="The architecture ptxas compiled for, e.g. sm_90.")
    registers: int = Field(default=0, description="Registers per thread.")
    spill_stores_bytes: int = Field(default=0, description="Bytes of registers spilled to local memory (stores).")
    spill_loads_bytes: int = Field(default=0, description="Bytes reloaded from spilled local memory (loads).")
    shared_bytes: int = Field(default=0, description="Static shared memory per block, bytes (dynamic not included).")
    stack_frame_bytes: int = Field(default=0, description="Per-thread stack frame (local arrays, spills), bytes.")
    constant_bytes: int = Field(
        default=0, description="Constant memory the entry uses, bytes, summed over the banks ptxas names (cmem[n])."
    )
    barriers: int = Field(default=0, description="Named barriers the entry uses (1 with __syncthreads).")

    @property
    def spills(self) -> bool:
        """True when the kernel spills registers to local memory."""
        return self.spill_stores_bytes > 0 or self.spill_loads_bytes > 0


def parse_ptxas(log: str, entry: str) -> PtxasReport | None:
    """The report of entry function ``entry`` in ptxas's verbose log, or None when ptxas compiled no such entry
    (the source does not define it as a ``__global__`` function)."""
    report: dict[str, int | str] = {}
    current: str | None = None  # the function whose lines these are
    found = False
    for line in log.splitlines():
        if compiling := _COMPILING.search(line):
            current = compiling.group("name")
            if current == entry:
                found = True
                report["arch"] = compiling.group("arch")
            continue
        if properties := _PROPERTIES.search(line):
            current = properties.group("name")
            continue
        if current != entry:
            continue
        if frame := _FRAME.search(line):
            report["stack_frame_bytes"] = int(frame.group("stack"))
            report["spill_stores_bytes"] = int(frame.group("stores"))
            report["spill_loads_bytes"] = int(frame.group("loads"))
        if used := _USED.search(line):
            report["registers"] = int(used.group("registers"))
            barriers = _BARRIERS.search(line)
            smem = _SMEM.search(line)
            report["barriers"] = int(barriers.group("barriers")) if barriers else 0
            report["shared_bytes"] = int(smem.group("bytes")) if smem else 0
            report["constant_bytes"] = sum(int(m.group("bytes")) for m in _CMEM.finditer(line))
    return PtxasReport.model_validate(report) if found else None


def compiled_entries(log: str) -> list[str]:
    """Every entry function ptxas compiled, in order (what a source defines as ``__global__``)."""
    return [m.group("name") for m in _COMPILING.finditer(log)]
