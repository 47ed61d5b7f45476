"""How fast is this machine? Its measured bandwidth and peak, the denominators of every roofline figure.

Measured once per hardware fingerprint and thread budget, in sandboxed workers that run no candidate code:
numpy's copy, read stream, cache copy and sgemm, and the judge's own copies (engine/harness/stream_copy.py, with
streaming and with plain stores), since a kernel can move its bytes faster than glibc's memcpy does (a copy
that keeps four streams in flight moved 40 GB/s where numpy's copy moved 30, and kernels then read above 100%
of a roofline that was no ceiling). Cached on disk under the cache folder (``machine/limits-<key>.json``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from engine import config
from engine.hardware import MachineLimits, hardware_fingerprint, hardware_key, llc_bytes
from engine.harness import protocol as p
from engine.harness.calibration_lock import calibration_lock
from engine.harness.cpu import compile_source
from engine.harness.driver import Contender, Failed
from engine.harness.sandbox import CpuLease, SandboxLimits
from engine.harness.stream_copy import copy_bytes, stream_copy_source
from engine.harness.verdicts import Verdict
from engine.problems import Problem

# How long a measurement waits for CPUs no other sandbox on the machine holds before using shared ones.
EXCLUSIVE_WAIT_S = 120.0
# The largest input pool a benchmark rotates through, and so the working set the streaming bandwidth is
# measured on: the bandwidth a kernel meets is the one of the pool it actually streams, whatever the LLC
# the machine reports (a VM's LLC is shared with tenants it cannot see).
MAX_POOL_BYTES = 256 << 20
# Names how the streaming bandwidth is measured; limits cached by another estimator are measured again.
# v1 counted numpy's copy as three streams (read, write-allocate, write-back), but glibc copies a large
# buffer with non-temporal stores (two streams), which overstated the bandwidth about 1.5x.
# v2 took the best of numpy's read stream and copy; v3 adds the judge's compiled copies.
LIMITS_ESTIMATOR = "read-or-copy-2-streams-or-stream-copy/v3"

_limits_lock = threading.Lock()
_limits_memo: dict[str, MachineLimits] = {}


class CalibrationFailed(RuntimeError):
    """The machine's limits could not be measured: the machine's problem, never a kernel's verdict."""


def machine_limits(threads: int = 1, cache_dir: Path | None = None, *, isolation: str = "auto") -> MachineLimits:
    """Measured bandwidth and peak for ``threads`` cores: once per process, cached on disk per hardware."""
    key = f"{hardware_key(hardware_fingerprint(threads))}-t{threads}"
    with _limits_lock:
        if key in _limits_memo:
            return _limits_memo[key]
        path = config.machine_dir(cache_dir) / f"limits-{key}.json"
        limits = _cached(path)
        if limits is None:
            with calibration_lock(path):
                # Another process may have measured while this one waited for the lock.
                limits = _cached(path)
                if limits is None:
                    limits = _calibrate(key, threads, cache_dir, isolation)
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(limits.model_dump_json())
                    tmp.replace(path)
        _limits_memo[key] = limits
        return limits


def _cached(path: Path) -> MachineLimits | None:
    """The limits cached at ``path`` when they were measured the current way; None means measure."""
    if not path.is_file():
        return None
    try:
        limits = MachineLimits.model_validate_json(path.read_text())
    except ValueError:
        return None  # a torn or foreign file: measure again rather than trust it
    return limits if limits.estimator == LIMITS_ESTIMATOR else None


def _calibrate(key: str, threads: int, cache_dir: Path | None, isolation: str) -> MachineLimits:
    from engine.problems import load_problem

    # The worker's plan names a problem's ABI; calibration touches none of it.
    problem = load_problem("softmax")
    lease = CpuLease(threads, wait_s=EXCLUSIVE_WAIT_S)
    contender: Contender | None = None
    try:
        contender = Contender(
            problem,
            label="calibration",
            kind="none",
            threads=threads,
            cpus=lease.cpus,
            limits=SandboxLimits(wall_seconds=300, cpu_seconds=600, address_space_bytes=4 << 30),
            cache_dir=cache_dir,
            isolation=isolation,
        )
        reply, _ = contender.request(
            p.Calibrate(dram_bytes=MAX_POOL_BYTES, gemm_n=1024 if threads == 1 else 2048),
            timeout=300,
            what="calibration",
        )
        contender.close()
        copies = [
            _copy_bps(problem, streaming, threads, lease.cpus, cache_dir, isolation) for streaming in (True, False)
        ]
    except Failed as failed:
        raise CalibrationFailed(f"machine calibration failed: {failed.message}") from None
    finally:
        if contender is not None:
            contender.discard()
        lease.release()
    if not isinstance(reply, p.Calibration):
        raise CalibrationFailed(f"machine calibration failed: the worker answered {reply.kind}")
    return MachineLimits(
        key=key,
        threads=threads,
        dram_bandwidth_gbs=max([reply.dram_bps, *(c for c in copies if c is not None)]) / 1e9,
        cache_bandwidth_gbs=reply.cache_bps / 1e9,
        peak_gflops=reply.peak_flops / 1e9,
        llc_bytes=llc_bytes() or 32 << 20,
        stream_bytes=MAX_POOL_BYTES,
        estimator=LIMITS_ESTIMATOR,
    )


def _copy_bps(
    problem: Problem, streaming: bool, threads: int, cpus: list[int], cache_dir: Path | None, isolation: str
) -> float | None:
    """Bytes per second (read + written) of ``problem``'s copy (with streaming or plain stores) on a working set
    of MAX_POOL_BYTES, best of a few calls in a sandboxed worker; None where it cannot be built or run (the
    machine's other figures stand): numpy's copy is the floor of the estimate, this can only raise it."""
    source = stream_copy_source(problem, streaming=streaming)
    compiled = compile_source(problem, source, cache_dir=cache_dir) if source is not None else None
    if compiled is None or compiled.verdict != Verdict.ok:
        return None
    (array,) = {tuple(q.shape) for q in problem.params if q.is_array}  # softmax: x and y are (rows, cols)
    cols = 4096
    shape = {array[0]: MAX_POOL_BYTES // (2 * 4 * cols), array[1]: cols}
    contender: Contender | None = None
    try:
        contender = Contender(
            problem,
            label="calibration",
            kind="artifact",
            artifact_id=compiled.artifact_id,
            threads=threads,
            cpus=cpus,
            limits=SandboxLimits(wall_seconds=120, cpu_seconds=240, address_space_bytes=4 << 30),
            cache_dir=cache_dir,
            isolation=isolation,
        )
        reply, _ = contender.request(p.Calibrate(entry_shape=shape), timeout=120, what="calibration")
        contender.close()
    except Failed:
        return None
    finally:
        if contender is not None:
            contender.discard()
    if not isinstance(reply, p.Calibration) or not reply.entry_ns:
        return None
    return copy_bytes(problem, shape) / (reply.entry_ns / 1e9)
