"""The program that runs candidate kernels inside the sandbox. The engine runs it as a script; never import it.

It has two roles, in one file because both must start under the sandbox's clean environment with nothing
but the standard library (and numpy for the worker):

``init``
    The first process of a sandbox: PID 1 of its own PID namespace, or a child subreaper in the fallback.
    It applies the resource limits and the CPU affinity, drops root privileges, starts the command, reaps
    every descendant, writes the command's exit status (and rusage) to ``--status``, and kills whatever the
    command left behind before it exits.

``worker``
    Loads the candidate's shared library with ctypes and executes a plan the parent wrote: validation
    trials in guarded buffers with NaN-prefilled outputs, interleaved timed rounds against reference
    points, or a calibration of the machine's bandwidth and peak.

Protocol with the parent (sandbox.py, validation.py, benchmarking.py beside this file): the parent writes
``plan.json`` and every validation input (``.npy``) into the private directory. The worker appends JSON lines
to ``progress.jsonl`` with unbuffered ``write`` calls, so each line survives a crash right after it, and
writes what the parent must judge: whole guarded regions (``.bin``) after each trial, timings (``.npy``),
outputs of timed calls. The worker never decides correctness and never sees a reference answer.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

EXIT_VIOLATION = 3
EXIT_HARNESS_ERROR = 4
# Benchmark inputs: use u of an input slot adds (u % BUMP_CYCLE + 1) / 64 to its first element.
BUMP_CYCLE = 8
BUMP_STEP = 1 / 64


# ------------------------------------------------------------------------------------------- worker role


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


class Violation(Exception):
    """The candidate broke a sandbox rule (threads, processes, affinity) during a call."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check = check
        self.message = message


class Progress:
    """Unbuffered JSON-lines log: each line is in the kernel's hands before the next candidate call."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(self, **event: Any) -> None:
        event["t"] = round(time.monotonic(), 4)
        os.write(self.fd, (json.dumps(event) + "\n").encode())


class Watchdog:
    """Checks after each candidate call that it left no thread, process or affinity change behind."""

    def __init__(self, threads: int, process_check: str, cpus: set[int]) -> None:
        self.allowed_extra_threads = threads - 1
        self.process_check = process_check
        self.cpus = cpus
        self.me = os.getpid()
        self.baseline: set[str] = set()
        self.rebase()

    def rebase(self) -> None:
        """Threads alive now belong to the harness (numpy, BLAS): only new ones are the candidate's."""
        self.baseline = set(os.listdir("/proc/self/task"))

    def _running(self, tid: str) -> bool:
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] == "R"

    def check(self) -> None:
        new = set(os.listdir("/proc/self/task")) - self.baseline
        if len(new) > self.allowed_extra_threads:
            raise Violation(
                "threads",
                f"{len(new)} thread(s) the candidate started were still alive after it returned "
                f"(allowed: {self.allowed_extra_threads}); a kernel must finish all its work before returning",
            )
        if new:
            time.sleep(0.002)
            busy = [t for t in new if self._running(t)]
            if busy:
                raise Violation(
                    "threads",
                    f"{len(busy)} thread(s) the candidate started kept running after it returned; "
                    "work done after the return would escape the timing",
                )
        if self.process_check == "namespace":
            others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, self.me)]
            if others:
                raise Violation(
                    "processes",
                    f"{len(others)} process(es) the candidate started were alive after it returned; "
                    "kernels may not fork",
                )
        elif _children(self.me):
            raise Violation("processes", "the candidate left child processes running after it returned")
        if os.sched_getaffinity(0) != self.cpus:
            raise Violation(
                "affinity",
                f"the candidate changed its CPU affinity to {sorted(os.sched_getaffinity(0))} "
                f"(pinned to {sorted(self.cpus)})",
            )


_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int64": ctypes.c_int64, "int32": ctypes.c_int32}


class Region:
    """One array argument inside a larger allocation: guard bytes, the data (64-byte aligned), guard bytes."""

    def __init__(self, np: Any, dims: tuple[int, ...], dtype: str, guard: Any) -> None:
        self.np = np
        self.guard = guard
        g = len(guard)
        itemsize = np.dtype(dtype).itemsize
        self.nbytes = int(np.prod(dims, dtype=np.int64)) * itemsize
        total = g + self.nbytes + g
        self.buffer = np.empty(total + 64, dtype=np.uint8)
        offset = (-(self.buffer.ctypes.data + g)) % 64
        self.raw = self.buffer[offset : offset + total]
        self.data = self.raw[g : g + self.nbytes].view(dtype).reshape(dims)
        self.address = self.raw.ctypes.data + g

    def arm(self) -> None:
        g = len(self.guard)
        self.raw[:g] = self.guard
        self.raw[g + self.nbytes :] = self.guard


def _aligned_empty(np: Any, dims: tuple[int, ...], dtype: str) -> Any:
    itemsize = np.dtype(dtype).itemsize
    nbytes = int(np.prod(dims, dtype=np.int64)) * itemsize
    buffer = np.empty(nbytes + 64, dtype=np.uint8)
    offset = (-buffer.ctypes.data) % 64
    return buffer[offset : offset + nbytes].view(dtype).reshape(dims)


def _poison(np: Any, array: Any) -> None:
    """Fill an output with a value no correct kernel leaves behind: NaN for floats, a pattern for ints."""
    if array.dtype.kind == "f":
        array.fill(np.nan)
    else:
        array.view(np.uint8).fill(0xA5)


def _dims(param: dict[str, Any], shape: dict[str, int]) -> tuple[int, ...]:
    return tuple(int(shape[d]) for d in param["shape"])


def _is_array(param: dict[str, Any]) -> bool:
    return param["role"] in ("in", "out", "inout")


def _scalar(param: dict[str, Any], shape: dict[str, int], scalars: dict[str, Any]) -> Any:
    kind = _CTYPES[param["dtype"]]
    if param["role"] == "size":
        return kind(int(shape[param["name"]]) if param["name"] in shape else int(scalars[param["name"]]))
    return kind(scalars[param["name"]])


class Worker:
    """Executes one plan in the sandbox; see the module docstring for the protocol."""

    def __init__(self, plan_path: Path) -> None:
        self.dir = plan_path.parent
        self.plan: dict[str, Any] = json.loads(plan_path.read_text())
        self.progress = Progress(self.dir / "progress.jsonl")
        self.params: list[dict[str, Any]] = self.plan.get("params", [])
        self.functions: dict[str, Any] = {}
        self.module: Any = None
        self.np: Any = None
        self.watchdog: Watchdog | None = None

    def setup(self) -> None:
        shim = self.plan.get("shim")
        if shim:
            # Before numpy and any candidate: a fatal signal then reports its address and memory use.
            lib = ctypes.CDLL(str(self.dir / shim))
            lib.kf_install_fatal_handlers(self.progress.fd)
        import numpy

        self.np = numpy
        if self.plan.get("problem_py"):
            spec = importlib.util.spec_from_file_location("kf_sandboxed_problem", self.dir / self.plan["problem_py"])
            assert spec is not None and spec.loader is not None
            self.module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self.module)
        argtypes = [ctypes.c_void_p if _is_array(p) else _CTYPES[p["dtype"]] for p in self.params]
        for contender in self.plan.get("contenders", []):
            if contender["kind"] != "artifact":
                continue
            self.progress.emit(ev="load", contender=contender["label"])
            copies = []
            for name in contender["libraries"]:
                library = ctypes.CDLL(str(self.dir / name), mode=os.RTLD_NOW | os.RTLD_LOCAL)
                function = getattr(library, self.plan["entry"])
                function.argtypes = argtypes
                function.restype = None
                copies.append(function)
            self.functions[contender["label"]] = copies
            self.progress.emit(ev="loaded", contender=contender["label"])
        cpus = set(self.plan.get("cpus") or os.sched_getaffinity(0))
        self.watchdog = Watchdog(int(self.plan.get("threads", 1)), self.plan.get("process_check", "children"), cpus)

    def run(self) -> None:
        self.setup()
        for phase in self.plan["phases"]:
            kind = phase["kind"]
            self.progress.emit(ev="phase", phase=phase.get("label", kind))
            if kind == "validate":
                self.validate(phase)
            elif kind == "benchmark":
                self.benchmark(phase)
            elif kind == "calibrate":
                self.calibrate(phase)
            else:
                raise ValueError(f"unknown phase {kind!r}")
        self.progress.emit(ev="finished")

    # -- validation ------------------------------------------------------------------------------------

    def validate(self, phase: dict[str, Any]) -> None:
        np = self.np
        assert self.watchdog is not None
        guard = np.fromfile(self.dir / phase["guard_file"], dtype=np.uint8)
        function = self.functions["candidate"][0]
        for group in phase["groups"]:
            shape = group["shape"]
            regions = {p["name"]: Region(np, _dims(p, shape), p["dtype"], guard) for p in self.params if _is_array(p)}
            for case in group["cases"]:
                # The same regions serve every case of the shape: two different inputs back to back in the
                # same buffers expose a kernel that caches results across calls.
                for p in self.params:
                    if not _is_array(p):
                        continue
                    region = regions[p["name"]]
                    region.arm()
                    if p["role"] == "out":
                        _poison(np, region.data)
                    else:
                        region.data[...] = np.load(self.dir / case["inputs"][p["name"]])
                args = [
                    regions[p["name"]].address if _is_array(p) else _scalar(p, shape, case.get("scalars", {}))
                    for p in self.params
                ]
                self.progress.emit(ev="start", case=case["id"])
                started = time.perf_counter_ns()
                function(*args)
                elapsed = time.perf_counter_ns() - started
                self.watchdog.check()
                for name, region in regions.items():
                    region.raw.tofile(self.dir / f"{case['id']}.{name}.bin")
                self.progress.emit(ev="done", case=case["id"], ns=elapsed)

    # -- benchmark -------------------------------------------------------------------------------------

    def benchmark(self, phase: dict[str, Any]) -> None:
        np = self.np
        assert self.watchdog is not None
        contenders = self.plan["contenders"]
        labels = [c["label"] for c in contenders]
        for index, spec in enumerate(phase["shapes"]):
            gc.collect()
            gc.disable()
            try:
                self._benchmark_shape(np, index, spec, labels, contenders, phase)
            finally:
                gc.enable()

    def _benchmark_shape(
        self,
        np: Any,
        index: int,
        spec: dict[str, Any],
        labels: list[str],
        contenders: list[dict[str, Any]],
        phase: dict[str, Any],
    ) -> None:
        assert self.watchdog is not None
        shape = spec["shape"]
        seeds = spec["seeds"]
        pool = [self.module.make_inputs(shape, spec["distribution"], np.random.default_rng(seed)) for seed in seeds]
        arrays = [p for p in self.params if _is_array(p)]
        outs = [p for p in arrays if p["role"] in ("out", "inout")]
        # Output slots rotate with a period coprime to the input slots': a kernel that skips work when it
        # sees an input pointer again finds another input's answer (or NaN) in its output buffer.
        out_pool = [
            {p["name"]: _aligned_empty(np, _dims(p, shape), p["dtype"]) for p in outs} for _ in range(spec["out_slots"])
        ]
        aligned_pool = []
        for inputs in pool:
            slot = {}
            for p in arrays:
                if p["role"] in ("in", "inout"):
                    copy = _aligned_empty(np, _dims(p, shape), p["dtype"])
                    copy[...] = inputs[p["name"]]
                    slot[p["name"]] = copy
            aligned_pool.append(slot)
        for slot in out_pool:
            for array in slot.values():
                _poison(np, array)
        n_in, n_out = len(aligned_pool), len(out_pool)
        inouts = [p["name"] for p in outs if p["role"] == "inout"]
        callers = []
        for contender in contenders:
            if contender["kind"] == "artifact":
                callers.append(("artifact", self.functions[contender["label"]]))
            else:
                callers.append(("numpy", self.module.baseline))
        scalars = {p["name"]: _scalar(p, shape, pool[0]) for p in self.params if not _is_array(p)}
        # numpy reads the very arrays the kernels read.
        numpy_inputs = [{**inputs, **slot} for inputs, slot in zip(pool, aligned_pool, strict=True)]
        del pool
        # Each use of an input slot changes its first element a little (untimed), so no input repeats
        # exactly: a kernel that memoizes answers by input content gains nothing, or returns a stale one.
        bumped = next((p["name"] for p in arrays if p["role"] != "out" and p["dtype"].startswith("float")), None)
        base0 = [slot[bumped].reshape(-1)[0] if bumped else None for slot in aligned_pool]
        steps = [np.float32((k + 1) * BUMP_STEP) for k in range(BUMP_CYCLE)]
        slot_uses = [0] * n_in
        last_writer = [-1] * n_out
        last_input = [(-1, 0)] * n_out
        last_call = [-1] * n_out
        uses = [0] * len(callers)
        counter = 0
        perf = time.perf_counter_ns
        watchdog = self.watchdog

        def call(which: int) -> int:
            nonlocal counter
            i, q = counter % n_in, counter % n_out
            counter += 1
            kind, functions = callers[which]
            uses[which] += 1
            bump = slot_uses[i] % BUMP_CYCLE
            slot_uses[i] += 1
            if bumped:
                aligned_pool[i][bumped].reshape(-1)[0] = base0[i] + steps[bump]
            if kind == "numpy":
                inputs = numpy_inputs[i]
                started = perf()
                functions(inputs, shape)
                elapsed = perf() - started
                watchdog.rebase()
                return elapsed
            # Copies of the library at different addresses take turns: code placement (alignment, cache
            # and branch-predictor aliasing) varies within the run instead of biasing one contender.
            function = functions[uses[which] % len(functions)]
            slot, out = aligned_pool[i], out_pool[q]
            for name in inouts:
                np.copyto(out[name], slot[name])  # an inout (state) starts from its pristine value
            args = [
                (out[p["name"]] if p["role"] != "in" else slot[p["name"]]).ctypes.data
                if _is_array(p)
                else scalars[p["name"]]
                for p in self.params
            ]
            started = perf()
            function(*args)
            elapsed = perf() - started
            watchdog.check()
            last_writer[q], last_input[q], last_call[q] = which, (i, bump), counter
            return elapsed

        n = len(callers)
        budget_ns = int(spec["budget_s"] * 1e9)
        warm_ns = int(budget_ns * phase.get("warmup_fraction", 0.1))
        min_rounds, max_rounds = int(phase.get("min_rounds", 5)), int(phase.get("max_rounds", 100000))
        self.progress.emit(ev="bench_start", index=index)
        loop_started = started = perf()
        rounds = 0
        # A fresh random order each round: no contender always runs first, or always right after the
        # one that pollutes the caches most (a fixed rotation A B C, B C A, C A B has A follow C twice as
        # often as B does, which biases an A/A comparison).
        order = list(range(n))
        shuffle = random.Random(int(phase.get("order_seed", 0)) * 1000003 + index).shuffle
        while rounds < phase.get("warmup_rounds", 3) or perf() - started < warm_ns:
            shuffle(order)
            for which in order:
                call(which)
            rounds += 1
        samples = []
        started = perf()
        rounds = 0
        while True:
            row = [0] * n
            shuffle(order)
            for which in order:
                row[which] = call(which)
            samples.append(row)
            rounds += 1
            if rounds >= max_rounds or (rounds >= min_rounds and perf() - started >= budget_ns):
                break
        loop_ns = perf() - loop_started
        timings = np.asarray(samples, dtype=np.int64)
        np.save(self.dir / f"bench{index}.npy", timings)
        checks: list[dict[str, int]] = []
        # The candidate's most recent outputs: a kernel that turns wrong late is wrong in these.
        recent = sorted((q for q in range(n_out) if last_writer[q] == 0), key=lambda q: -last_call[q])
        for q in recent:
            if len(checks) < spec.get("check_slots", 2):
                for p in outs:
                    np.save(self.dir / f"bench{index}.check{len(checks)}.{p['name']}.npy", out_pool[q][p["name"]])
                i, bump = last_input[q]
                checks.append({"seed": seeds[i], "bump": bump if bumped else -1, "out_slot": q})
        self.progress.emit(
            ev="bench_done", index=index, rounds=rounds, checks=checks, timed_ns=int(timings.sum()), loop_ns=loop_ns
        )

    # -- calibration -----------------------------------------------------------------------------------

    def calibrate(self, phase: dict[str, Any]) -> None:
        np = self.np
        perf = time.perf_counter_ns

        def best(fn: Any, repeats: int) -> float:
            times = []
            for _ in range(repeats):
                started = perf()
                fn()
                times.append(perf() - started)
            return min(times) / 1e9

        # A copy moves each byte three times: read the source, read the destination line it is about to
        # overwrite (write-allocate), write it back. Counting all three gives the bus's real capacity.
        source = np.ones(int(phase.get("dram_bytes", 256 << 20)) // 4, dtype=np.float32)
        target = np.zeros_like(source)
        dram = 3 * source.nbytes / best(lambda: np.copyto(target, source), 5)
        dram = max(dram, source.nbytes / best(source.max, 5))  # a SIMD reduction: a pure read stream
        source = target = np.zeros(0, dtype=np.float32)
        small = np.ones(int(phase.get("cache_bytes", 256 << 10)) // 4, dtype=np.float32)
        other = np.zeros_like(small)
        cache = 2 * small.nbytes * 50 / best(lambda: [np.copyto(other, small) for _ in range(50)], 20)
        n = int(phase.get("gemm_n", 1024))
        x = np.ones((n, n), dtype=np.float32)
        y = np.ones((n, n), dtype=np.float32)
        peak = 2.0 * n**3 / best(lambda: x @ y, 10)
        self.progress.emit(ev="calibration", dram_bps=dram, cache_bps=cache, peak_flops=peak)


def worker_main(argv: list[str]) -> int:
    worker = Worker(Path(argv[0]))
    try:
        worker.run()
    except Violation as violation:
        worker.progress.emit(ev="violation", check=violation.check, message=violation.message)
        return EXIT_VIOLATION
    except MemoryError:
        worker.progress.emit(ev="error", kind="memory", message="out of memory (address-space limit reached)")
        return EXIT_HARNESS_ERROR
    except OSError as error:
        kind = "load" if "cannot open shared object" in str(error) or "undefined symbol" in str(error) else "harness"
        worker.progress.emit(ev="error", kind=kind, message=str(error), trace=traceback.format_exc()[-2000:])
        return EXIT_HARNESS_ERROR
    except Exception as error:
        worker.progress.emit(ev="error", kind="harness", message=repr(error), trace=traceback.format_exc()[-2000:])
        return EXIT_HARNESS_ERROR
    return 0


def main() -> int:
    return worker_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
