"""The sandboxed CUDA child: owns the CUDA context, loads the contenders' cubins, runs them on the judge's
commands. engine/harness/cuda/contender.py starts it as a script in a sandbox; never import it.

Like the CPU worker it is a servant, not a witness: it never decides correctness and never sees a reference
answer. For a validation trial it writes each array into a guarded device region (guard pattern, data or
NaN pre-fill, guard pattern: engine/harness/cuda/layout.py), launches, synchronizes and copies every whole
region back to the parent, which checks guards, inputs and outputs. For a benchmark it times calls with
CUDA events recorded by this process's own code (engine/harness/cuda/timing.py).

Why there is no seccomp filter here, unlike the CPU worker: a CUDA candidate is device code only. It has no
host code, so it cannot make a system call, open a file or start a process; the driver, which does need
ioctl and mmap on /dev/nvidia*, is the only thing talking to the kernel. What device code can do is corrupt
device memory (caught by the guards, or a fault that kills this context: a ``crash`` verdict), loop forever
(the parent's watchdog kills this process: ``timeout``), or keep state across calls in ``__device__``
globals (the repeated, perturbed and rotating-buffer checks). The sandbox's other limits still apply:
a clean environment, a private directory, the wall clock and, where the machine allows, namespaces.

A fault (any failed driver call) is answered with a :class:`~engine.harness.cuda.messages.Fault` naming the
call and the CUresult, and the process exits: after an illegal address or a trap the context is unusable.
"""

from __future__ import annotations

import os
import sys

# The parent's import roots: an isolated interpreter (python -I) ignores PYTHONPATH, and a GPU machine may
# have the project installed there rather than in site-packages. Before any import of the engine.
for _entry in reversed(os.environ.get("KF_IMPORT_PATHS", "").split(os.pathsep)):
    if _entry and _entry not in sys.path:
        sys.path.insert(0, _entry)

import importlib  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from engine.harness import protocol as p  # noqa: E402
from engine.harness.cuda import messages as m  # noqa: E402
from engine.harness.cuda.arguments import KernelArguments  # noqa: E402
from engine.harness.cuda.bandwidth import measure_copy_bandwidth  # noqa: E402
from engine.harness.cuda.device import CudaError, CudaUnavailable, Gpu, use_driver  # noqa: E402
from engine.harness.cuda.fingerprint import read_gpu_fingerprint  # noqa: E402
from engine.harness.cuda.layout import (  # noqa: E402
    array_nbytes,
    guarded_image,
    poison_fill,
    region_layout,
    storage_dtype,
)
from engine.harness.cuda.timing import EventClock, TimedCall, round_order  # noqa: E402

# Where each use's drift lands (Bench.bump): drawn from the system's randomness, on the host, where no kernel
# reads.
_DRIFT = random.Random()


class Fatal(Exception):
    """A driver call failed: answered with a Fault, then the process exits."""

    def __init__(self, error: CudaError, during: str, contender: int | None) -> None:
        super().__init__(str(error))
        self.error, self.during, self.contender = error, during, contender

    def fault(self) -> m.Fault:
        e = self.error
        return m.Fault(
            during=self.during, contender=self.contender, call=e.call, code=e.code, name=e.name, message=str(e)
        )


class Module:
    """A module contender: its own cuModule and kernel function."""

    def __init__(self, gpu: Gpu, image: bytes, entry: str) -> None:
        self.module = gpu.load_module(image)
        self.function = gpu.function(self.module, entry)
        self.shared_allowed = 0

    def prepare(self, gpu: Gpu, launch: m.LaunchDims) -> None:
        # The function's dynamic shared memory attribute is a maximum, and the last value set wins: only ever
        # raise it. (Setting it per launch size, once each, broke shapes needing 97 KiB, then 56, then 97
        # again: the third launch found 56 set and the device refused it with CUDA_ERROR_INVALID_VALUE.)
        if launch.shared_bytes > self.shared_allowed:
            gpu.prepare_launch(self.function, launch)
            self.shared_allowed = launch.shared_bytes


class Worker:
    """Serves the judge's commands; see the module docstring."""

    def __init__(self, commands: int, replies: int) -> None:
        self.commands, self.replies = commands, replies
        self.gpu: Gpu | None = None
        self.plan: m.CudaPlan | None = None
        self.modules: dict[int, Module] = {}
        self.problem: Any = None
        self.cupy: Any = None
        self.regions: dict[str, tuple[int, Any]] = {}  # name -> (device address, RegionLayout)
        self.region_shape: dict[str, int] | None = None
        self.bench: Bench | None = None
        self.clock: EventClock | None = None
        self.during = "start"
        self.contender: int | None = None

    def _gpu(self) -> Gpu:
        assert self.gpu is not None, "no context: the plan comes first"
        return self.gpu

    # -- start-up ----------------------------------------------------------------------------------------

    def start(self, plan: m.CudaPlan, payload: bytearray) -> m.CudaReady:
        self.plan = plan
        use_driver(plan.driver_module)
        self.gpu = gpu = Gpu(0)
        library = ""
        offset = 0
        for index, spec in enumerate(plan.contenders):
            self.contender = index
            if spec.kind == "module":
                image = bytes(payload[offset : offset + spec.cubin_bytes])
                offset += spec.cubin_bytes
                self.during = "load"
                self.modules[index] = Module(gpu, image, spec.entry)
            elif not library and self.cupy is None:
                library = self._load_library(plan)
        self.contender = None
        self.during = "start"
        fingerprint = read_gpu_fingerprint(gpu)
        return m.CudaReady(gpu=fingerprint, free_bytes=gpu.free_memory(), library=library, notes=gpu.notes)

    def _load_library(self, plan: m.CudaPlan) -> str:
        """Import CuPy and the problem for the library baseline; '' when ready, else why not."""
        try:
            cupy = importlib.import_module(plan.library_module)
        except Exception as error:  # not installed, or built for another CUDA: the baseline is skipped
            return (
                f"{plan.library_module} is not importable here ({type(error).__name__}: {error}); "
                "install cupy-cuda12x or cupy-cuda13x"
            )
        if plan.problem_folder is None:
            return "the plan names no problem folder for the library baseline"
        from engine.problems import load_problem

        self.problem = load_problem(plan.problem_folder)
        if not hasattr(self.problem.module, "cuda_baseline"):
            return f"problem {self.problem.name!r} defines no cuda_baseline(cp, inputs, shape)"
        cupy.cuda.Device(0).use()
        self.cupy = cupy
        return ""

    # -- validation --------------------------------------------------------------------------------------

    def trial(self, command: m.CudaTrial, payload: bytearray) -> tuple[p.TrialDone, list[memoryview]]:
        gpu, plan, trial = self._gpu(), self.plan, command.trial
        assert plan is not None
        module = self.modules[command.contender]
        guard = bytes(payload[: trial.guard])
        arrays = [q for q in plan.params if q.is_array]
        if not trial.reuse_regions or self.region_shape != trial.shape or not self.regions:
            # The same regions serve every trial of a shape: two inputs back to back in the same buffers expose
            # a kernel that caches results across calls (in a __device__ global, keyed by pointer).
            self._free_regions()
            for q in arrays:
                layout = region_layout([int(trial.shape[d]) for d in q.shape], q.dtype, trial.guard)
                self.regions[q.name] = (gpu.alloc(layout.total), layout)
            self.region_shape = dict(trial.shape)
        given = {a.name: a for a in trial.inputs}
        offset = trial.guard
        self.during = "copy"
        for q in arrays:
            address, layout = self.regions[q.name]
            if q.role == "out":
                data: Any = poison_fill(q.dtype, layout.nbytes // storage_dtype(q.dtype).itemsize, trial.poison)
            else:
                spec = given[q.name]
                data = np.frombuffer(payload, dtype=np.uint8, count=spec.nbytes, offset=offset)
                offset += spec.nbytes
            gpu.upload(address, guarded_image(layout, guard, data))
        pointers = {q.name: self.regions[q.name][0] + self.regions[q.name][1].data_offset for q in arrays}
        arguments = KernelArguments(plan.params, pointers, trial.shape, trial.scalars)
        module.prepare(gpu, command.launch)
        started = time.perf_counter_ns()
        self.during = "launch"
        gpu.launch(module.function, command.launch, arguments)
        self.during = "sync"
        gpu.synchronize()
        elapsed = time.perf_counter_ns() - started
        self.during = "copy"
        pieces, specs = [], []
        for q in arrays:
            address, layout = self.regions[q.name]
            host = np.empty(layout.total, dtype=np.uint8)
            gpu.download(host, address)
            pieces.append(host.data)
            specs.append(p.ArraySpec(name=q.name, dtype="uint8", dims=[layout.total], nbytes=layout.total))
        done = p.TrialDone(id=trial.id, regions=specs, call_ns=elapsed, payload_bytes=sum(s.nbytes for s in specs))
        return done, pieces

    def _free_regions(self) -> None:
        for address, _ in self.regions.values():
            self._gpu().free(address)
        self.regions = {}

    # -- benchmark ---------------------------------------------------------------------------------------

    def prepare(self, command: m.CudaPrepare, payload: bytearray) -> p.Prepared:
        gpu = self._gpu()
        self.during = "copy"
        if self.bench is not None:
            self.bench.close()
            self.bench = None
        self._free_regions()
        self.region_shape = None
        if self.clock is None or self.clock.flush_bytes != command.flush_bytes:
            if self.clock is not None:
                self.clock.close()
            self.clock = EventClock(gpu, command.flush_bytes)
        self.bench = Bench(self, command, payload)
        return p.Prepared(in_slots=len(command.seeds), out_slots=command.out_slots)

    def warm(self, command: m.CudaWarm) -> m.CudaTimes | m.LibraryUnusable:
        assert self.bench is not None and self.clock is not None, "warm-up before CudaPrepare"
        self.contender = command.contender
        self.during = "warm-up"
        if command.contender in self.bench.unusable:
            reason = self.bench.unusable[command.contender]
            self.contender = None
            return m.LibraryUnusable(reason=f"the library baseline could not be prepared: {reason}")
        call = self.bench.calls[command.contender]
        try:
            ns = self.clock.time([call] * command.calls)
        except CudaError:
            raise
        except Exception as error:
            if not isinstance(call, LibraryCall):
                raise
            # CuPy failed on its own (a missing header for its JIT, an API the problem's baseline misuses): the
            # baseline is left out, the kernels are still timed. A fault of the context surfaces here instead.
            self._gpu().synchronize("cuStreamSynchronize (after the library baseline failed)")
            del self.bench.calls[command.contender]
            self.contender = None
            detail = "".join(traceback.format_exception_only(error)).strip()[-1500:]
            return m.LibraryUnusable(reason=f"the library baseline failed on its first calls: {detail}")
        self.contender = None
        return m.CudaTimes(ns=ns)

    def rounds(self, command: m.CudaRounds) -> m.CudaTimings:
        assert self.bench is not None and self.clock is not None, "rounds before CudaPrepare"
        self.during = "timed rounds"
        orders = [round_order(command.contenders, command.first_round + r) for r in range(command.rounds)]
        calls: list[TimedCall] = [self.bench.calls[c] for order in orders for c in order]
        ns = self.clock.time(calls)
        rows = []
        width = len(command.contenders)
        for r, order in enumerate(orders):
            by_contender = dict(zip(order, ns[r * width : (r + 1) * width], strict=True))
            rows.append([by_contender[c] for c in command.contenders])
        return m.CudaTimings(ns=rows)

    def fetch(self, command: m.CudaFetch) -> tuple[p.Outputs, list[memoryview]]:
        assert self.bench is not None, "fetch before CudaPrepare"
        self.during = "copy"
        return self.bench.fetch(command.contender)

    # -- the loop ----------------------------------------------------------------------------------------

    def handle(self, command: Any, payload: bytearray) -> bool:
        """Answer one command; False after Finish."""
        if isinstance(command, m.CudaTrial):
            self.contender = command.contender
            done, pieces = self.trial(command, payload)
            self.contender = None
            p.write_message(self.replies, done, *pieces)
        elif isinstance(command, m.CudaRounds):
            p.write_message(self.replies, self.rounds(command))
        elif isinstance(command, m.CudaWarm):
            p.write_message(self.replies, self.warm(command))
        elif isinstance(command, m.CudaPrepare):
            p.write_message(self.replies, self.prepare(command, payload))
        elif isinstance(command, m.CudaFetch):
            outputs, pieces = self.fetch(command)
            p.write_message(self.replies, outputs, *pieces)
        elif isinstance(command, m.MeasureBandwidth):
            self.during = "bandwidth"
            p.write_message(self.replies, measure_copy_bandwidth(self._gpu(), command.nbytes, command.repeats))
        elif isinstance(command, p.Finish):
            p.write_message(self.replies, p.Bye())
            return False
        else:
            raise p.ProtocolError(f"unexpected command {command.kind}")
        return True

    def serve(self) -> None:
        command, payload = p.read_message(self.commands, m.COMMANDS, None, what="command")
        if not isinstance(command, m.CudaPlan):
            raise p.ProtocolError(f"the first command must be the plan, not {command.kind}")
        try:
            ready = self.start(command, payload)
        except CudaError as error:
            p.write_message(self.replies, Fatal(error, self.during, self.contender).fault())
            return
        except CudaUnavailable as error:
            p.write_message(self.replies, p.Failure(what="load", message=str(error)))
            return
        p.write_message(self.replies, ready)
        while True:
            command, payload = p.read_message(self.commands, m.COMMANDS, None, what="command")
            try:
                try:
                    if not self.handle(command, payload):
                        return
                except CudaError:
                    raise
                except Exception:
                    # CuPy (the library baseline) raising its own error may be a kernel's earlier fault surfacing
                    # in the shared context: if the stream holds one, that fault is the answer.
                    if self.gpu is not None:
                        self.gpu.synchronize("cuStreamSynchronize (after an error in our own code)")
                    raise
            except CudaError as error:
                contender = self.contender if self.during != "timed rounds" else None
                p.write_message(self.replies, Fatal(error, self.during, contender).fault())
                return


class ModuleCall:
    """A module contender's next benchmark call: rotating input set and output slot, in-out state restored."""

    def __init__(self, worker: Worker, bench: Bench, index: int, launch: m.LaunchDims) -> None:
        assert worker.plan is not None
        self.gpu = worker._gpu()
        self.bench = bench
        self.module = worker.modules[index]
        self.module.prepare(self.gpu, launch)
        self.launch_dims = launch
        self.params = worker.plan.params
        self.index = index
        self.count = 0
        self.last_bump = -1
        self.last_position = 0
        self.pointers: dict[str, int] = {}

    def prepare(self) -> None:
        bench = self.bench
        i, o = self.count % len(bench.inputs), self.count % bench.out_slots
        self.count += 1
        self.last_bump, self.last_position = bench.bump(self.index, i)
        slot, out = bench.inputs[i], bench.outputs[self.index][o]
        self.pointers = {}
        for q in self.params:
            if q.role == "in":
                self.pointers[q.name] = slot[q.name]
            elif q.is_array:
                self.pointers[q.name] = out[q.name]
                if q.role == "inout":  # an in-out (state) starts from its pristine value, outside the timing
                    self.gpu.copy(out[q.name], slot[q.name], bench.nbytes[q.name])
        self.scalars = bench.scalars[i]

    def launch(self) -> None:
        arguments = KernelArguments(self.params, self.pointers, self.bench.shape, self.scalars)
        self.gpu.launch(self.module.function, self.launch_dims, arguments)

    def last(self) -> tuple[int, int]:
        """(input set, output slot) of the last call queued."""
        n = self.count - 1
        return n % len(self.bench.inputs), n % self.bench.out_slots


class LibraryCall:
    """The library baseline's next call: the problem's ``cuda_baseline`` through CuPy, on our stream, on the same
    input sets as the kernels (an in-out array is a copy of its input set's, restored before every call)."""

    def __init__(self, worker: Worker, bench: Bench, index: int) -> None:
        assert worker.plan is not None
        self.index = index
        cp = self.cp = worker.cupy
        self.gpu = worker._gpu()
        self.problem = worker.problem
        self.stream = cp.cuda.ExternalStream(self.gpu.stream_handle())
        self.bench = bench
        self.count = 0
        self.restore: list[tuple[int, int, int]] = []  # (target, source, bytes) before the call
        self.sets: list[dict[str, Any]] = []
        self.inouts = [q for q in worker.plan.params if q.role == "inout"]
        scratch = {q.name: bench.alloc(bench.nbytes[q.name]) for q in self.inouts}
        for slot, scalars in zip(bench.inputs, bench.scalars, strict=True):
            arrays: dict[str, Any] = {}
            for q in worker.plan.params:
                if q.role == "scalar":
                    arrays[q.name] = storage_dtype(q.dtype).type(scalars[q.name])  # numpy scalars, as documented
                elif q.role in ("in", "inout"):
                    address = scratch[q.name] if q.role == "inout" else slot[q.name]
                    memory = cp.cuda.UnownedMemory(address, bench.nbytes[q.name], self, 0)  # device 0: ours
                    arrays[q.name] = cp.ndarray(
                        bench.dims[q.name], dtype=storage_dtype(q.dtype), memptr=cp.cuda.MemoryPointer(memory, 0)
                    )
            self.sets.append(arrays)
        self.copies = [
            [(scratch[q.name], slot[q.name], bench.nbytes[q.name]) for q in self.inouts] for slot in bench.inputs
        ]
        self.result: Any = None

    def prepare(self) -> None:
        i = self.count % len(self.sets)
        self.current = self.sets[i]
        self.count += 1
        self.bench.bump(self.index, i)
        for target, source, nbytes in self.copies[i]:
            self.gpu.copy(target, source, nbytes)

    def launch(self) -> None:
        with self.stream:
            self.result = self.problem.cuda_baseline(self.cp, self.current, self.bench.shape)


class Bench:
    """A benchmark shape's device buffers and each contender's call."""

    def __init__(self, worker: Worker, command: m.CudaPrepare, payload: bytearray) -> None:
        plan = worker.plan
        assert plan is not None
        gpu = self.gpu = worker._gpu()
        self.shape = command.shape
        self.seeds = command.seeds
        self.out_slots = command.out_slots
        self.allocations: list[int] = []
        self.dims = {q.name: [int(command.shape[d]) for d in q.shape] for q in plan.params if q.is_array}
        self.nbytes = {q.name: array_nbytes(self.dims[q.name], q.dtype) for q in plan.params if q.is_array}
        self.dtypes = {q.name: q.dtype for q in plan.params}
        self.outs = [q for q in plan.params if q.role in ("out", "inout")]
        self.inputs: list[dict[str, int]] = []
        self.scalars = command.scalars
        # The input one element of which drifts with every use of its set (as on the CPU: protocol.drift_value):
        # the first float or bfloat16 array that is not an output -- the one the parent replays the drift on to
        # check a timed output (engine/harness/benchmarking.py check_timed_output).
        self.bumped = next(iter(p.varied(plan.params)), None)
        # Per input set: the drifting array as uploaded (host copy), and the element the last use drifted.
        self.pristine: list[Any] = []
        self.drifted: list[int] = []
        offset = 0
        for specs in command.arrays:
            slot = {}
            for spec in specs:
                address = self.alloc(spec.nbytes)
                gpu.upload(address, np.frombuffer(payload, dtype=np.uint8, count=spec.nbytes, offset=offset))
                if self.bumped is not None and spec.name == self.bumped.name:
                    storage = storage_dtype(spec.dtype)
                    count = spec.nbytes // storage.itemsize
                    self.pristine.append(np.frombuffer(payload, dtype=storage, count=count, offset=offset).copy())
                    self.drifted.append(0)
                offset += spec.nbytes
                slot[spec.name] = address
            self.inputs.append(slot)
        self.uses: dict[int, list[int]] = {}  # per contender, per input set: how often it was used
        # Every contender has output slots of its own: a fetch reads the candidate's last output, never what a
        # reference wrote over it since.
        self.outputs: dict[int, list[dict[str, int]]] = {}
        self.calls: dict[int, TimedCall] = {}
        self.unusable: dict[int, str] = {}  # contenders that could not be prepared, and why
        for index, contender in enumerate(plan.contenders):
            launch = command.launches[index] if index < len(command.launches) else None
            if contender.kind == "module" and launch is not None:
                self.outputs[index] = [self._output_slot() for _ in range(command.out_slots)]
                self.calls[index] = ModuleCall(worker, self, index, launch)
            elif contender.kind == "library" and worker.cupy is not None:
                try:
                    self.calls[index] = LibraryCall(worker, self, index)
                except CudaError:
                    raise
                except Exception as error:  # CuPy's own failure: the baseline is left out (warm-up says why)
                    self.unusable[index] = "".join(traceback.format_exception_only(error)).strip()[-1500:]
        gpu.synchronize("cuStreamSynchronize (after uploading the input sets)")

    def bump(self, contender: int, slot: int) -> tuple[int, int]:
        """Before a call of ``contender`` on input set ``slot`` (outside the timed region): put back the element
        the set's last use drifted, and drift one drawn at random. The drift's (step, element), or (-1, 0)
        where no input drifts. The element is never the same one for long, so a kernel that remembers each
        set's answer must read the whole input to find what changed (as on the CPU, engine/harness/worker.py)."""
        if self.bumped is None:
            return -1, 0
        uses = self.uses.setdefault(contender, [0] * len(self.inputs))
        step = uses[slot] % p.BUMP_CYCLE
        uses[slot] += 1
        pristine, address = self.pristine[slot], self.inputs[slot][self.bumped.name]
        itemsize = pristine.dtype.itemsize
        last = self.drifted[slot]
        self.gpu.upload(address + last * itemsize, pristine[last : last + 1])
        position = self.drifted[slot] = _DRIFT.randrange(pristine.size)
        # The same arithmetic the parent replays (engine/harness/benchmarking.py check_timed_output).
        value = np.asarray(p.drift_value(pristine[position], p.drift_steps(np, pristine.dtype)[step]), pristine.dtype)
        self.gpu.upload(address + position * itemsize, value)
        return step, position

    def alloc(self, nbytes: int) -> int:
        """A device buffer freed with the shape's others."""
        address = self.gpu.alloc(nbytes)
        self.allocations.append(address)
        return address

    def _output_slot(self) -> dict[str, int]:
        slot = {}
        for q in self.outs:
            address = self.alloc(self.nbytes[q.name])
            self.gpu.upload(address, poison_fill(q.dtype, self.nbytes[q.name] // storage_dtype(q.dtype).itemsize))
            slot[q.name] = address
        return slot

    def fetch(self, index: int) -> tuple[p.Outputs, list[memoryview]]:
        call = self.calls[index]
        if not isinstance(call, ModuleCall) or call.count == 0:
            return p.Outputs(seed=-1, bump=-1, arrays=[], payload_bytes=0), []
        i, o = call.last()
        specs, pieces = [], []
        for q in self.outs:
            storage = storage_dtype(q.dtype)
            host = np.empty(self.nbytes[q.name] // storage.itemsize, dtype=storage)
            self.gpu.download(host, self.outputs[index][o][q.name])
            specs.append(p.ArraySpec(name=q.name, dtype=str(storage), dims=self.dims[q.name], nbytes=host.nbytes))
            pieces.append(host.view(np.uint8).data)
        outputs = p.Outputs(
            seed=self.seeds[i],
            bump=call.last_bump,
            position=call.last_position,
            arrays=specs,
            payload_bytes=sum(s.nbytes for s in specs),
        )
        return outputs, pieces

    def close(self) -> None:
        self.gpu.synchronize("cuStreamSynchronize (before freeing a shape's buffers)")
        for address in self.allocations:
            self.gpu.free(address)
        self.allocations = []


def main() -> int:
    # The two descriptors the parent passed: commands in, replies out.
    commands, replies = (int(fd) for fd in sys.argv[1:3])
    worker = Worker(commands, replies)
    try:
        worker.serve()
    except (p.ChannelClosed, BrokenPipeError):
        pass  # the parent went away or gave up on us: nothing to report to
    except p.ProtocolError as error:
        os.write(2, f"CUDA worker: {error}\n".encode())
        os._exit(p.EXIT_PROTOCOL)
    except BaseException as error:
        # Our own code failed (the candidate has no host code): say where, for the harness's evidence.
        detail = "".join(traceback.format_exception(error))[-3000:]
        try:
            p.write_message(worker.replies, p.Failure(what="harness", message=detail))
        except OSError:
            pass
        os.write(2, f"CUDA worker failed: {detail}\n".encode())
        os._exit(p.EXIT_WORKER_ERROR)
    # os._exit: no exit handlers; the driver tears the context down with the process.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
