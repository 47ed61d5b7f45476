"""The sandboxed worker: loads one contender (a candidate's library, or the problem's numpy baseline) and runs
it on the judge's commands. The engine runs it as a script in the sandbox; never import it.

It is a servant, not a witness: it never times anything the judge believes, never decides correctness and
never sees a reference answer. The parent (engine/harness/driver.py) sends commands on one pipe and reads
one reply per command on another (engine/harness/protocol.py); the parent's own clock times each batch of
calls from the Go it writes to the Done it reads, and every output it judges comes back on the pipe right
after the call, before any more candidate code runs.

Start-up, in this order (the candidate's code can run only after the last step):

1. read the Plan; load the fatal-signal reporter (a crash reports its signal, address and, for a refused
   system call, its number on the fatal pipe); import numpy and the problem module;
2. drop to the unprivileged uid the plan names (the interpreter had to start as uid 0 without
   capabilities where ``nobody`` cannot read it);
3. install the seccomp filter's load stage, load the library (the static screen has made sure no code of
   it runs at load time), then the run stage: from here on the process can read and write the descriptors
   it has, use memory, futexes and clocks, and exit -- nothing else;
4. arm the tripwire on the interpreter (engine/harness/tripwire.py) for a candidate's library;
5. reply Ready and serve commands until Finish, then leave with ``os._exit`` (no exit handlers run).
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import mmap
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from engine.harness import protocol as p


class Region:
    """One array argument inside a larger allocation: guard bytes, the data (``shift`` bytes past a 64-byte
    boundary), guard bytes."""

    def __init__(self, np: Any, dims: tuple[int, ...], dtype: str, guard: Any, shift: int = 0) -> None:
        self.guard = guard
        g = len(guard)
        dtype = p.storage(dtype)
        itemsize = np.dtype(dtype).itemsize
        self.nbytes = int(np.prod(dims, dtype=np.int64)) * itemsize
        total = g + self.nbytes + g
        self.buffer = np.empty(total + 128, dtype=np.uint8)
        offset = (-(self.buffer.ctypes.data + g)) % 64 + shift % 64
        self.raw = self.buffer[offset : offset + total]
        self.data = self.raw[g : g + self.nbytes].view(dtype).reshape(dims)
        self.address = self.raw.ctypes.data + g

    def arm(self) -> None:
        g = len(self.guard)
        self.raw[:g] = self.guard
        self.raw[g + self.nbytes :] = self.guard


_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int64": ctypes.c_int64, "int32": ctypes.c_int32}
# Output pre-fills: quiet NaNs with different payloads, so a kernel that reads its output before writing it
# (or leaves it alone) gives different bits on two identical calls.
_POISON_BITS = {4: (0x7FC00000, 0x7FC0DEAD), 8: (0x7FF8000000000000, 0x7FF800000000BEEF)}
# bfloat16 outputs (uint16, the only arrays stored so) are poisoned with its quiet NaNs, as on the GPU.
_BF16_POISON_BITS = (0x7FC0, 0x7FDE)


PAGE = mmap.PAGESIZE

LINE = 64
"""Every output starts on a cache line: a kernel's aligned vector stores (and streaming stores) need it."""


def output_offsets(count: int) -> list[int]:
    """Where each of ``count`` output arrays starts within its first page: spread over the page in whole
    cache lines (0, then about PAGE / count apart).

    The inputs in the pool are page-aligned, and where an output starts relative to them decides how often the
    core mistakes a store to the output for a load of the input of the same page offset (4K aliasing): at
    64 bytes apart a copy with streaming stores ran at 24 GB/s, at other offsets 30-40, on the same machine.
    Left to malloc, that offset depended on what the worker had allocated before: the first benchmark shape's
    outputs were mmapped at 64 bytes into their page, later shapes' came from the heap at other offsets, and a
    streaming-store kernel read 30-40% slower on whichever shape came first. Each output slot at its own
    offset makes every shape's timing the average over several placements, the same for every contender and
    every position."""
    return [(k * PAGE // max(count, 1)) // LINE * LINE for k in range(count)]


def _placed_empty(np: Any, dims: tuple[int, ...], dtype: str, page_offset: int) -> Any:
    """An uninitialised array in an anonymous private mapping of its own, ``page_offset`` bytes into its first
    page: where it lies is this module's choice, never the allocator's."""
    dtype = p.storage(dtype)
    nbytes = int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize
    mapping = mmap.mmap(-1, page_offset + max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(mapping, np.uint8, nbytes, page_offset).view(dtype).reshape(dims)


def _aligned_empty(np: Any, dims: tuple[int, ...], dtype: str) -> Any:
    dtype = p.storage(dtype)
    itemsize = np.dtype(dtype).itemsize
    nbytes = int(np.prod(dims, dtype=np.int64)) * itemsize
    buffer = np.empty(nbytes + 64, dtype=np.uint8)
    offset = (-buffer.ctypes.data) % 64
    return buffer[offset : offset + nbytes].view(dtype).reshape(dims)


def _poison(np: Any, array: Any, variant: int = 0) -> None:
    """Fill an output with a value no correct kernel leaves behind: NaN for floats, a pattern for ints."""
    if array.dtype.kind == "f" and array.dtype.itemsize in _POISON_BITS:
        bits = _POISON_BITS[array.dtype.itemsize][variant % 2]
        array.view(f"u{array.dtype.itemsize}").fill(bits)
    elif array.dtype == np.uint16:
        array.fill(_BF16_POISON_BITS[variant % 2])
    else:
        array.view(np.uint8).fill(0xA5 if variant % 2 == 0 else 0x5A)


class Worker:
    """Serves one contender; see the module docstring."""

    def __init__(self, directory: Path, commands: int, replies: int, fatal: int) -> None:
        self.dir = directory
        self.commands, self.replies, self.fatal_fd = commands, replies, fatal
        self.plan: p.Plan | None = None
        self.np: Any = None
        self.module: Any = None
        self.function: Any = None
        self.regions: dict[str, Region] = {}
        self.region_shape: dict[str, int] | None = None
        self.region_shifts: dict[str, int] = {}
        self.bench: _Bench | None = None

    # -- start-up ----------------------------------------------------------------------------------------

    def start(self, plan: p.Plan) -> p.Ready:
        # Imported now: after the uid drop the engine's files may be unreadable, after the filter unopenable.
        from engine.harness import tripwire
        from engine.harness.privileges import drop_privileges
        from engine.harness.seccomp import confine

        self.plan = plan
        if plan.shim:
            # Before numpy and any candidate: a fatal signal then reports its address (or system call).
            ctypes.CDLL(str(self.dir / plan.shim)).kf_install_fatal_handlers(self.fatal_fd)
        import numpy

        # A warning printed once confined would open its source file (refused): never print one.
        numpy.seterr(all="ignore")
        warnings.simplefilter("ignore")
        self.np = numpy
        if plan.problem_py:
            spec = importlib.util.spec_from_file_location("kf_sandboxed_problem", self.dir / plan.problem_py)
            assert spec is not None and spec.loader is not None
            self.module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(self.module)
            except MemoryError:
                raise
            except Exception as error:
                # problem.py alone is copied here: it imports numpy and the standard library only (a module or
                # file next to it in its folder is not here, and would not be on another machine's worker).
                raise ProblemCodeFailed(
                    f"importing problem.py raised {error!r}; it may import numpy and the standard library only, "
                    "and read no file of its folder"
                ) from None
        if plan.warm_up is not None and self.module is not None:
            # Problem code (trusted) imports lazily, e.g. numpy.random on first use: do it while imports work.
            shape = plan.warm_up.shape
            try:
                inputs = self.module.make_inputs(shape, plan.warm_up.distribution, numpy.random.default_rng(0))
                self.module.baseline(inputs, shape)
            except MemoryError:
                raise
            except Exception as error:
                raise ProblemCodeFailed(f"make_inputs or baseline at {shape} raised {error!r}") from None
        if plan.cpus:
            # The sandbox started us unpinned (workers import in parallel); every thread is pinned now, before
            # any candidate code runs (the filter then refuses sched_setaffinity).
            for task in os.listdir("/proc/self/task"):
                os.sched_setaffinity(int(task), set(plan.cpus))
        if plan.drop_to is not None:
            drop_privileges(*plan.drop_to)
        if plan.confine:
            # Libraries a kernel may link against are loaded before the filter, so loading the candidate
            # needs to open nothing but its own file.
            for name in ("libm.so.6", "libmvec.so.1", "libgomp.so.1"):
                try:
                    ctypes.CDLL(name)
                except OSError:
                    pass
            confine("load", threads=plan.threads)
        if plan.contender == "artifact":
            assert plan.library is not None
            library = ctypes.CDLL(str(self.dir / plan.library), mode=os.RTLD_NOW | os.RTLD_LOCAL)
            self.function = getattr(library, plan.entry)
            self.function.argtypes = [ctypes.c_void_p if q.is_array else _CTYPES[q.dtype] for q in plan.params]
            self.function.restype = None
        if plan.confine:
            confine("run", threads=plan.threads)
        if plan.contender == "artifact":
            # Before any of the candidate's code has run (the screen allows none at load time).
            tripwire.arm()
        return p.Ready(confined=plan.confine, uid=os.getuid())

    # -- validation --------------------------------------------------------------------------------------

    def trial(self, trial: p.Trial, payload: bytearray) -> tuple[p.TrialDone, list[memoryview]]:
        np = self.np
        assert self.plan is not None
        guard = np.frombuffer(payload, dtype=np.uint8, count=trial.guard)
        if not trial.reuse_regions or self.region_shape != trial.shape or self.region_shifts != trial.shifts:
            # The same regions serve every trial of a shape: two inputs back to back in the same buffers
            # expose a kernel that caches results across calls.
            self.regions = {
                q.name: Region(
                    np, tuple(int(trial.shape[d]) for d in q.shape), q.dtype, guard, trial.shifts.get(q.name, 0)
                )
                for q in self.plan.params
                if q.is_array
            }
            self.region_shape = dict(trial.shape)
            self.region_shifts = dict(trial.shifts)
        offset = trial.guard
        given = {a.name: a for a in trial.inputs}
        for q in self.plan.params:
            if not q.is_array:
                continue
            region = self.regions[q.name]
            region.guard = guard
            region.arm()
            if q.role == "out":
                _poison(np, region.data, trial.poison)
            else:
                spec = given[q.name]
                region.raw[len(guard) : len(guard) + spec.nbytes] = np.frombuffer(
                    payload, dtype=np.uint8, count=spec.nbytes, offset=offset
                )
                offset += spec.nbytes
        args = [
            self.regions[q.name].address if q.is_array else _scalar(q, trial.shape, trial.scalars)
            for q in self.plan.params
        ]
        started = time.perf_counter_ns()
        self.function(*args)
        elapsed = time.perf_counter_ns() - started
        regions = [self.regions[q.name] for q in self.plan.params if q.is_array]
        specs = [
            p.ArraySpec(name=q.name, dtype="uint8", dims=[r.raw.size], nbytes=r.raw.size)
            for q, r in zip([q for q in self.plan.params if q.is_array], regions, strict=True)
        ]
        done = p.TrialDone(id=trial.id, regions=specs, call_ns=elapsed, payload_bytes=sum(s.nbytes for s in specs))
        return done, [memoryview(r.raw) for r in regions]

    # -- benchmark ---------------------------------------------------------------------------------------

    def prepare(self, command: p.PreparePools, payload: bytearray) -> p.Prepared:
        assert self.plan is not None
        self.bench = None
        gc.collect()
        self.bench = _Bench(self, command, payload)
        if self.bench.mapping is not None:
            # Every page of the pool mapped in now, outside any timed call: the first batch that read a slot paid
            # its page faults, which on the fresh-input probe's new pool (a batch of first reads, after the
            # rounds) made an honest kernel look several times slower than in the rounds.
            self.np.frombuffer(self.bench.mapping, self.np.uint8)[::PAGE].sum()
        return p.Prepared(in_slots=len(self.bench.inputs), out_slots=len(self.bench.outputs))

    def calibrate(self, command: p.Calibrate) -> p.Calibration:
        np = self.np
        perf = time.perf_counter_ns
        if command.entry_shape is not None:
            return p.Calibration(dram_bps=0.0, cache_bps=0.0, peak_flops=0.0, entry_ns=self._entry_ns(command))

        def best(fn: Any, repeats: int) -> float:
            times = []
            for _ in range(repeats):
                started = perf()
                fn()
                times.append(perf() - started)
            return min(times) / 1e9

        # Measured in the roofline model's currency, bytes read + bytes written per second: the best a kernel
        # can do moving its model bytes. A large copy counts two streams (glibc writes it with non-temporal
        # stores, so there is no write-allocate read to count); a SIMD reduction is a pure read stream.
        source = np.ones(command.dram_bytes // 4, dtype=np.float32)
        target = np.zeros_like(source)
        dram = 2 * source.nbytes / best(lambda: np.copyto(target, source), 5)
        dram = max(dram, source.nbytes / best(source.max, 5))
        source = target = np.zeros(0, dtype=np.float32)
        small = np.ones(command.cache_bytes // 4, dtype=np.float32)
        other = np.zeros_like(small)
        cache = 2 * small.nbytes * 50 / best(lambda: [np.copyto(other, small) for _ in range(50)], 20)
        n = command.gemm_n
        x = np.ones((n, n), dtype=np.float32)
        y = np.ones((n, n), dtype=np.float32)
        peak = 2.0 * n**3 / best(lambda: x @ y, 10)
        return p.Calibration(dram_bps=dram, cache_bps=cache, peak_flops=peak)

    def _entry_ns(self, command: p.Calibrate) -> float:
        """The loaded entry's best time of a few calls at ``entry_shape``: inputs page-aligned, as in the pool,
        outputs half a page off them (output_offsets), as a benchmark's outputs mostly are."""
        np, plan, shape = self.np, self.plan, command.entry_shape
        assert plan is not None and shape is not None and self.function is not None
        half = output_offsets(2)[1]
        args: list[Any] = []
        arrays = []  # held until the calls are done: an array's mapping is unmapped with the last reference to it
        for q in plan.params:
            if not q.is_array:
                args.append(_scalar(q, shape, {q.name: 0}))  # a copy ignores its scalars
                continue
            array = _placed_empty(np, tuple(int(shape[d]) for d in q.shape), q.dtype, 0 if q.role == "in" else half)
            array.fill(1)
            arrays.append(array)
            args.append(array.ctypes.data)
        self.function(*args)  # pages touched, code warm
        times = []
        for _ in range(5):
            started = time.perf_counter_ns()
            self.function(*args)
            times.append(time.perf_counter_ns() - started)
        return float(min(times))

    # -- the loop ----------------------------------------------------------------------------------------

    def serve(self) -> int:
        command, _ = p.read_command(self.commands)
        if not isinstance(command, p.Plan):
            raise p.ProtocolError(f"the first command must be the plan, not {command.kind}")
        try:
            ready = self.start(command)
        except OSError as error:
            p.write_message(self.replies, p.Failure(what="load", message=str(error)))
            return 0
        p.write_message(self.replies, ready)
        while True:
            command, payload = p.read_command(self.commands)
            try:
                if isinstance(command, p.Go):
                    assert self.bench is not None, "Go before PreparePools"
                    p.write_message(self.replies, self.bench.batch(command))
                elif isinstance(command, p.Trial):
                    done, pieces = self.trial(command, payload)
                    p.write_message(self.replies, done, *pieces)
                elif isinstance(command, p.Refresh):
                    assert self.bench is not None, "Refresh before PreparePools"
                    p.write_message(self.replies, self.bench.refresh(command))
                elif isinstance(command, p.Fetch):
                    assert self.bench is not None, "Fetch before PreparePools"
                    outputs, pieces = self.bench.fetch(command)
                    p.write_message(self.replies, outputs, *pieces)
                elif isinstance(command, p.PreparePools):
                    p.write_message(self.replies, self.prepare(command, payload))
                elif isinstance(command, p.Calibrate):
                    p.write_message(self.replies, self.calibrate(command))
                elif isinstance(command, p.Finish):
                    p.write_message(self.replies, p.Bye())
                    return 0
                else:
                    raise p.ProtocolError(f"unexpected command {command.kind}")
            except MemoryError:
                self.bench = None
                p.write_message(self.replies, p.Failure(what="memory", message="out of memory (address-space limit)"))


class _Bench:
    """A benchmark shape's pools and the batch loop over them."""

    def __init__(self, worker: Worker, command: p.PreparePools, payload: bytearray) -> None:
        np = worker.np
        plan = worker.plan
        assert plan is not None
        shape = command.shape
        self.np = np
        self.seeds = command.seeds
        arrays = [q for q in plan.params if q.is_array]
        self.outs = [q for q in arrays if q.role in ("out", "inout")]
        self.inouts = [q.name for q in arrays if q.role == "inout"]
        self.inputs: list[dict[str, Any]] = []
        self.mapping: Any = None
        if plan.pool_fd is not None and not payload:
            # A private copy-on-write mapping of the shared pool file (whose descriptor is read-only): every
            # contender reads the same physical pages, and the drift written below (or anything the
            # candidate writes) stays in this process's own copy of the page it touched.
            self.mapping = mmap.mmap(plan.pool_fd, command.pool_bytes, access=mmap.ACCESS_COPY)
        offset = 0
        for specs, scalars in zip(command.arrays, command.scalars, strict=True):
            slot: dict[str, Any] = dict(scalars)  # numpy's baseline reads the scalars too
            for spec in specs:
                if self.mapping is not None and spec.offset is not None:
                    stored = p.storage(spec.dtype)
                    count = spec.nbytes // np.dtype(stored).itemsize
                    array = np.frombuffer(self.mapping, stored, count, spec.offset).reshape(spec.dims)
                else:
                    array = _aligned_empty(np, tuple(spec.dims), spec.dtype)
                    array.reshape(-1).view(np.uint8)[...] = np.frombuffer(payload, np.uint8, spec.nbytes, offset)
                    offset += spec.nbytes
                slot[spec.name] = array
            self.inputs.append(slot)
        del payload
        # Output slots rotate with a period coprime to the input slots': a kernel that skips work when it
        # sees an input pointer again finds another input's answer (or NaN) in its output buffer.
        offsets = iter(output_offsets(command.out_slots * len(self.outs)))
        self.outputs = [
            {
                q.name: _placed_empty(np, tuple(int(shape[d]) for d in q.shape), q.dtype, next(offsets))
                for q in self.outs
            }
            for _ in range(command.out_slots)
        ]
        # Where a batch's kept call's output is copied (Go.keep), and which call wrote it.
        self.spare = {q.name: _placed_empty(np, tuple(int(shape[d]) for d in q.shape), q.dtype, 0) for q in self.outs}
        self.spare_wrote: tuple[int, int, int, int] = (-1, -1, 0, -1)
        for slot in [*self.outputs, self.spare]:
            for array in slot.values():
                _poison(np, array)
        self.bumped = next((q.name for q in p.varied(arrays)), None)
        self.drift_key = command.drift_key
        self.drifting = [slot[self.bumped].reshape(-1) for slot in self.inputs] if self.bumped else []
        # Per input slot: the element the last use drifted, and its value before (restored at the next use).
        self.drifted = [(0, flat[0]) for flat in self.drifting]
        self.steps = p.drift_steps(np, self.drifting[0].dtype) if self.drifting else []
        self.uses = [0] * len(self.inputs)
        self.counter = 0
        # (input slot, bump, drifted element, call) of the call that last wrote each output slot.
        self.wrote: list[tuple[int, int, int, int]] = [(-1, -1, 0, -1)] * len(self.outputs)
        self.shape = shape
        # Each input slot's own scalars (a problem may draw them with its inputs, e.g. a random alpha): the
        # parent checks a fetched output against the slot's seed, scalars included.
        self.scalars = [
            {q.name: _scalar(q, shape, slot) for q in plan.params if not q.is_array} for slot in self.inputs
        ]
        self.numpy = plan.contender == "numpy"
        self.baseline = worker.module.baseline if self.numpy else None
        self.function = worker.function
        self.params = plan.params
        gc.collect()

    def _call(self) -> None:
        call = self.counter
        q = call % len(self.outputs)
        i, bump = p.timed_call_inputs(call, len(self.inputs))
        self.counter += 1
        self.uses[i] += 1
        slot = self.inputs[i]
        position = 0
        if self.bumped:
            flat = self.drifting[i]
            last, before = self.drifted[i]
            flat[last] = before
            position = p.drift_position(self.drift_key, call, flat.size)
            before = flat[position]
            self.drifted[i] = (position, before)
            flat[position] = p.drift_value(before, self.steps[bump])
        out = self.outputs[q]
        self.wrote[q] = (i, bump if self.bumped else -1, position, call)
        if self.numpy:
            assert self.baseline is not None
            # A slot's first use checks that the baseline leaves its inputs as it got them: one that changes
            # them in place would be timed on inputs that drift away from the ones drawn, call after call.
            before = (
                None if self.uses[i] > 1 else {k: a.copy() for k, a in slot.items() if isinstance(a, self.np.ndarray)}
            )
            try:
                self.baseline(slot, self.shape)
            except MemoryError:
                raise  # the address-space limit: the serve loop says so
            except Exception as error:
                raise ProblemCodeFailed(f"baseline(inputs, {self.shape}) raised {error!r}") from None
            changed = [name for name, array in (before or {}).items() if not self._same_bits(array, slot.get(name))]
            if changed:
                raise ProblemCodeFailed(
                    f"baseline(inputs, {self.shape}) changed its input {', '.join(map(repr, changed))} in place; it "
                    "must leave its inputs as it got them (compute into new arrays, or copy first)"
                )
            return
        for name in self.inouts:
            self.np.copyto(out[name], slot[name])  # an inout (state) starts from its pristine value
        scalars = self.scalars[i]
        self.function(
            *[
                (out[q.name] if q.role != "in" else slot[q.name]).ctypes.data if q.is_array else scalars[q.name]
                for q in self.params
            ]
        )

    def _same_bits(self, before: Any, after: Any) -> bool:
        """Whether ``after`` is still an array of ``before``'s dtype and shape holding the same bits (NaN too).

        engine.problem_host.same_bits says the same for a folder's host; it is not imported here because this
        worker imports nothing of the engine but the protocol (numpy arrives late, through self.np)."""
        np = self.np
        if not isinstance(after, np.ndarray) or after.dtype != before.dtype or after.shape != before.shape:
            return False
        return bool(
            np.array_equal(before.reshape(-1).view(np.uint8), np.ascontiguousarray(after).reshape(-1).view(np.uint8))
        )

    def batch(self, go: p.Go) -> p.Done:
        started = time.perf_counter_ns()
        for index in range(go.calls):
            self._call()
            if index == go.keep:
                # Copied at once, before the kernel runs again: a kernel that skips the calls of a batch it
                # guesses are never checked (all but the last output slots' worth) is caught on the kept one,
                # which the parent draws in secret. Every contender keeps one, so all pay the same copy.
                q = (self.counter - 1) % len(self.outputs)
                for name, array in self.outputs[q].items():
                    self.np.copyto(self.spare[name], array)
                self.spare_wrote = self.wrote[q]
        return p.Done(nonce=go.nonce, child_ns=time.perf_counter_ns() - started)

    def refresh(self, command: p.Refresh) -> p.Prepared:
        """Every element of every float input of every slot changed a little (Refresh), outside any timed call.
        Each slot's drifted element is put back first and the drift starts afresh, so the parent can replay a
        slot's inputs as its generated ones with every refresh so far applied, then the call's drift."""
        refreshed = [q.name for q in p.varied(self.params)]
        if self.bumped:
            for i, (last, before) in enumerate(self.drifted):
                self.drifting[i][last] = before
        for index, name in enumerate(refreshed):
            first = self.inputs[0][name]
            factors = p.refresh_factors(self.np, command.seed, index, first.size, first.dtype)
            for slot in self.inputs:
                p.apply_refresh(self.np, slot[name].reshape(-1), factors)
        if self.bumped:
            self.drifted = [(0, flat[0]) for flat in self.drifting]
        return p.Prepared(in_slots=len(self.inputs), out_slots=len(self.outputs))

    def fetch(self, command: p.Fetch) -> tuple[p.Outputs, list[memoryview]]:
        if command.kept:
            (i, bump, position, call), arrays = self.spare_wrote, list(self.spare.items())
        else:
            q = (self.counter - 1 - command.back) % len(self.outputs)
            (i, bump, position, call), arrays = self.wrote[q], list(self.outputs[q].items())
        specs = [p.ArraySpec(name=n, dtype=str(a.dtype), dims=list(a.shape), nbytes=a.nbytes) for n, a in arrays]
        outputs = p.Outputs(
            seed=self.seeds[i] if i >= 0 else -1,
            bump=bump,
            position=position,
            call=call,
            arrays=specs,
            payload_bytes=sum(s.nbytes for s in specs),
        )
        return outputs, [memoryview(a.reshape(-1).view(self.np.uint8)) for _, a in arrays]


class ProblemCodeFailed(Exception):
    """problem.py's own code (the numpy contender's baseline) raised in this worker: the problem's fault, never
    a kernel's or the machine's."""


def _scalar(param: p.ParamSpec, shape: dict[str, int], scalars: dict[str, Any]) -> Any:
    kind = _CTYPES[param.dtype]
    if param.role == "size":
        return kind(int(shape[param.name]) if param.name in shape else int(scalars[param.name]))
    return kind(scalars[param.name])


def main() -> int:
    # The three descriptors the parent passed: commands in, replies out, fatal-signal reports out.
    commands, replies, fatal = (int(fd) for fd in sys.argv[1:4])
    worker = Worker(Path.cwd(), commands, replies, fatal)
    try:
        worker.serve()
    except (p.ChannelClosed, BrokenPipeError):
        pass  # the parent went away or gave up on us: nothing to report to
    except p.ProtocolError as error:
        os.write(2, f"harness worker: {error}\n".encode())
        os._exit(p.EXIT_PROTOCOL)
    except ProblemCodeFailed as error:
        os.write(2, f"{p.PROBLEM_MARK} {str(error)[-1500:]}\n".encode())
        os._exit(p.EXIT_PROBLEM)
    except BaseException as error:
        # No traceback: printing one opens source files, which the filter refuses (it would read as the
        # kernel's forbidden system call).
        os.write(2, f"harness worker failed: {error!r}\n".encode())
        os._exit(p.EXIT_WORKER_ERROR)
    # os._exit: no exit handlers, no library destructors, nothing of the candidate's runs after its report.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
