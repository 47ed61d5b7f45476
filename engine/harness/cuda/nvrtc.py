"""NVRTC, run out of process: a CUDA source and options in, a cubin and the compiler's log out.

NVRTC is a library, and a library call cannot be stopped: a candidate written to keep the compiler busy
(a huge unrolled loop, a template recursion) would hold a worker's thread for good, and one that makes it
allocate without bound would take the worker's memory. So compiles run in child processes
(engine/harness/cuda/nvrtc_child.py) that confine themselves before reading a source, and the parent gives
each compile a wall-clock limit, killing the child past it. Children are kept between compiles (importing
``cuda.bindings`` costs about as much as compiling a small kernel), one per concurrent compile, and a child
that timed out or died is never reused.

The library comes from the ``nvidia-cuda-nvrtc`` wheel (a project dependency), which ``cuda.bindings`` finds
through ``cuda-pathfinder``: no CUDA toolkit and no GPU are needed.
"""

from __future__ import annotations

import atexit
import base64
import functools
import json
import math
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from engine.harness import compile_patience
from engine.harness.sandbox import tree_cpu_seconds

CHILD = Path(__file__).with_name("nvrtc_child.py")
COMPILE_TIMEOUT_S = 120.0
# Address space of a compiling child: NVRTC and its builtins map a few hundred MiB; a real kernel's compile
# stays well under a GiB.
ADDRESS_SPACE_BYTES = 8 << 30
# Variables a child may see: where the CUDA libraries are, if the machine says so. No API keys or tokens.
_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TMPDIR")
_READ_CHUNK = 1 << 16
HAD_ITS_CPU = compile_patience.HAD_ITS_CPU
"""Share of its limit an NVRTC compile must have run on a CPU for a stop to be the source's fault."""


@dataclass(frozen=True)
class NvrtcOutcome:
    """How one compile ended."""

    status: Literal["ok", "failed", "timeout", "held", "crashed"]
    """ok: a cubin; failed: NVRTC refused the source (the log says why); timeout: stopped at the wall-clock
    limit while compiling; held: the machine kept the child from running past its limit (see
    engine/harness/compile_patience.py), so it says nothing of the source; crashed: the child died or NVRTC failed
    outside compilation (``message`` says how)."""
    log: str = ""
    """NVRTC's log: errors and warnings, and ptxas's resource report (with ``--ptxas-options=-v``)."""
    cubin: bytes | None = None
    """The compiled cubin, when ok."""
    message: str = ""
    """What went wrong, for timeout and crashed."""


@functools.cache
def nvrtc_version() -> str | None:
    """The NVRTC library's version (``13.5``), or None when it cannot be loaded here."""
    try:
        from cuda.bindings import nvrtc

        status, major, minor = nvrtc.nvrtcVersion()
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None
        return f"{major}.{minor}"
    except Exception:  # no wheel, no toolkit, a broken install: the caller says what to install
        return None


def run_nvrtc(
    source: str, options: Sequence[str], *, name: str = "kernel.cu", timeout_s: float = COMPILE_TIMEOUT_S
) -> NvrtcOutcome:
    """Compile ``source`` with ``options`` in a child process, within ``timeout_s`` seconds of wall time."""
    request = {"source": source, "name": name, "options": list(options)}
    child = _POOL.take()
    try:
        try:
            reply = child.ask(request, timeout_s)
        except _Stopped as stopped:
            if not stopped.before_source:
                raise
            # An idle child that died meanwhile (killed from outside, say) is the harness's loss, not the
            # source's: the source goes to a fresh child.
            child.kill()
            child = _Child()
            reply = child.ask(request, timeout_s)
    except _Stopped as stopped:
        tail = child.stderr_tail()
        child.kill()
        return NvrtcOutcome(status=stopped.status, message=str(stopped), log=tail)
    _POOL.give_back(child)
    if reply["status"] == "ok":
        return NvrtcOutcome(status="ok", log=reply["log"], cubin=base64.b64decode(reply["cubin"]))
    if reply["status"] == "failed":
        return NvrtcOutcome(status="failed", log=reply["log"])
    return NvrtcOutcome(status="crashed", log=reply["log"], message=f"NVRTC returned {reply['result']}")


class _Stopped(Exception):
    """A compile that did not answer: it ran past its limit (timeout) or its child died (crashed)."""

    def __init__(
        self, status: Literal["timeout", "held", "crashed"], message: str, *, before_source: bool = False
    ) -> None:
        super().__init__(message)
        self.status: Literal["timeout", "held", "crashed"] = status
        self.before_source = before_source  # the child was found dead before it read the source


class _Child:
    """One NVRTC child process and its pipes."""

    def __init__(self) -> None:
        environment = {k: os.environ[k] for k in _ENVIRONMENT if k in os.environ}
        self.stderr: IO[bytes] = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(CHILD), str(ADDRESS_SPACE_BYTES), str(math.ceil(COMPILE_TIMEOUT_S))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=environment,
            close_fds=True,
        )
        self.pending = b""

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait for its reply line."""
        assert self.process.stdin is not None and self.process.stdout is not None
        started = time.monotonic()
        ran_before = tree_cpu_seconds(self.process.pid)
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            message = f"the NVRTC child died before it read the source ({error})"
            raise _Stopped("crashed", message, before_source=True) from None
        # The C compiler's rule (engine/harness/compile_patience.py): a compile a loaded machine slows is given
        # more time while it runs, and one that gains no CPU time past its limit is the machine's.
        patience = compile_patience.CompilePatience(timeout_s, HAD_ITS_CPU)
        descriptor = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while b"\n" not in self.pending:
                elapsed = time.monotonic() - started
                if patience.decide(elapsed, lambda: self._ran_since(ran_before)) is not None:
                    raise _Stopped(patience.stop or "timeout", f"{patience.reason()} (NVRTC)")
                if not selector.select(patience.next_check_s(elapsed)):
                    continue
                chunk = os.read(descriptor, _READ_CHUNK)
                if not chunk:
                    code = self.process.wait()
                    how = f"signal {-code}" if code < 0 else f"exit status {code}"
                    raise _Stopped("crashed", f"the NVRTC child died ({how}) while compiling")
                self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _ran_since(self, ran_before: float | None) -> float | None:
        """CPU seconds the child has run since it was sent the request (None where it cannot be told)."""
        ran_now = tree_cpu_seconds(self.process.pid)
        return None if ran_before is None or ran_now is None else ran_now - ran_before

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            self.stderr.seek(0)
            return self.stderr.read().decode(errors="replace")[-limit:]
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        self.process.kill()
        self.close()

    def close(self) -> None:
        """Close stdin (the child exits at end of input) and reap it."""
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


class _Pool:
    """Idle children, one per compile that ran at once (up to the machine's cores)."""

    def __init__(self) -> None:
        self.idle: list[_Child] = []
        self.lock = threading.Lock()
        self.owner = os.getpid()
        self.keep = os.cpu_count() or 2

    def take(self) -> _Child:
        with self.lock:
            if self.owner != os.getpid():  # a forked copy of this process: the children are not its own
                self.idle, self.owner = [], os.getpid()
            if self.idle:
                return self.idle.pop()
        return _Child()

    def give_back(self, child: _Child) -> None:
        with self.lock:
            if self.owner == os.getpid() and len(self.idle) < self.keep:
                self.idle.append(child)
                return
        child.close()

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        if self.owner == os.getpid():
            for child in idle:
                child.close()


_POOL = _Pool()
atexit.register(_POOL.close)
