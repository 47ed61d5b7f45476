"""The NVRTC child: compiles the CUDA sources its parent sends, one JSON line each way, until stdin closes.

Run as a script by engine/harness/cuda/nvrtc.py (``python -I nvrtc_child.py ADDRESS_SPACE CPU_SECONDS``), never
imported by the harness. It imports only the standard library and ``cuda.bindings``, so it starts quickly,
and it confines itself before it reads any source: an address-space limit (a source that makes the compiler
allocate without bound ends in an out-of-memory error, not a swapping machine), no core files, and a CPU-time
limit of CPU_SECONDS per compile, renewed before each one. The parent stops a compile that runs too long by
killing this process; the CPU limit is the backstop for a parent that died meanwhile (a child notices a dead
parent otherwise only at its next read, when stdin ends). A parent-death signal would not do: it fires when
the parent *thread* that started the child ends, and compiles start from short-lived worker threads.

A request is ``{"source", "name", "options"}``; a reply is ``{"status": "ok" | "failed" | "error", "result",
"log", "cubin"}``, with the cubin in base64 when the status is ok.
"""

import base64
import json
import math
import resource
import sys
from typing import Any


def _confine(address_space: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _allow_cpu(seconds: int) -> None:
    """Let the next compile use ``seconds`` more CPU time (SIGXCPU ends this process past it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = math.ceil(usage.ru_utime + usage.ru_stime)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + seconds if hard == resource.RLIM_INFINITY else min(used + seconds, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _compile(nvrtc: Any, request: dict[str, Any]) -> dict[str, Any]:
    success = nvrtc.nvrtcResult.NVRTC_SUCCESS
    options = [str(o).encode() for o in request["options"]]
    status, program = nvrtc.nvrtcCreateProgram(
        str(request["source"]).encode(), str(request["name"]).encode(), 0, [], []
    )
    if status != success:
        return {"status": "error", "result": status.name, "log": "", "cubin": None}
    try:
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        text = log.rstrip(b"\0").decode(errors="replace")
        if result != success:
            return {"status": "failed", "result": result.name, "log": text, "cubin": None}
        _, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = b" " * size
        (status,) = nvrtc.nvrtcGetCUBIN(program, cubin)
        if status != success:
            return {"status": "error", "result": status.name, "log": text, "cubin": None}
        return {"status": "ok", "result": result.name, "log": text, "cubin": base64.b64encode(cubin).decode()}
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def main() -> None:
    _confine(int(sys.argv[1]))
    cpu_seconds = int(sys.argv[2])
    from cuda.bindings import nvrtc

    for line in sys.stdin:
        _allow_cpu(cpu_seconds)
        reply = _compile(nvrtc, json.loads(line))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
