"""The parent's side of the sandboxed CUDA child: start it, talk to it under a watchdog, say what became of it.

The CUDA context lives in the child (engine/harness/cuda/worker.py), never here, so whatever a kernel does to
its context -- an illegal address, a trap, an endless loop -- costs the child, and the judge goes on. Every
reply is awaited with a deadline: a kernel that hangs keeps the child in ``cuStreamSynchronize`` past it,
and the child is killed (the driver tears its context down with the process, and the GPU is free again for
the next child). The outcome becomes a verdict:

- a :class:`~engine.harness.cuda.messages.Fault` reply: the CUresult decides (:func:`fault_verdict`): a
  fault of the kernel's own (illegal address, trap, misaligned access…) is ``crash``, a launch the device
  refused for its resources is ``resource_limit``, the display watchdog is ``timeout``; anything else (out
  of memory for the harness's own buffers, a cubin for another architecture) is the harness's failure;
- no reply within the deadline: ``timeout``;
- the child died: a fault signal while device code of a candidate was running is ``crash``; a kill from
  outside, or our own code failing, is the harness's failure (never the kernel's verdict).

The child is started like the CPU worker -- a separate process in a :class:`~engine.harness.sandbox.Sandbox`
with a clean environment, a private directory and the wall clock -- with three differences the CUDA driver
needs: no seccomp filter (see worker.py for why none is needed), no address-space limit (the driver
reserves virtual address space for unified addressing far beyond any sensible limit) and no uid drop (the
child runs as the calling user without capabilities: the device nodes and the driver's files must stay
reachable, and the candidate has no host code that could use the uid).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from pathlib import Path

from pydantic import BaseModel

import engine
from engine.config import settings
from engine.harness import protocol as p
from engine.harness.cuda import messages as m
from engine.harness.cuda.device import DEFAULT_DRIVER
from engine.harness.driver import Failed, SandboxFailure
from engine.harness.sandbox import Sandbox, SandboxLimits, SandboxOutcome, SandboxProcess
from engine.harness.verdicts import Verdict
from engine.outages import KERNEL_SIGNALS

CUDA_WORKER = Path(__file__).with_name("worker.py")
# Start-up: the interpreter, numpy, cuda-python, cuInit on a large machine, CuPy, the modules.
START_TIMEOUT_S = 180.0
# Variables the child gets from this process: which GPU, and where the driver and CUDA libraries are.
PASSED_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
# CUresults of a kernel's own faults (the context is lost with them).
CRASH_ERRORS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    }
)
# CUresults of a launch the device refused for what the kernel asked of it (registers, shared memory, block).
LAUNCH_REFUSALS = frozenset(
    {"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"}
)
# Driver calls whose refusal is the launch's (the kernel's own configuration).
LAUNCH_CALLS = ("cuLaunchKernel", "cuFuncSetAttribute")


def fault_verdict(fault: m.Fault) -> Verdict:
    """The verdict a CUDA fault gives the contender it happened to (see the module docstring)."""
    if fault.name == "CUDA_ERROR_LAUNCH_TIMEOUT":
        return Verdict.timeout
    if fault.name in CRASH_ERRORS:
        return Verdict.crash
    if fault.name in LAUNCH_REFUSALS and fault.call.startswith(LAUNCH_CALLS):
        return Verdict.resource_limit
    return Verdict.harness_error


def fault_message(fault: m.Fault, label: str) -> str:
    """One line for the evidence: what the driver said, during what, for whom."""
    what = {
        Verdict.crash: "the kernel faulted",
        Verdict.resource_limit: "the device refused the launch",
        Verdict.timeout: "the kernel ran into the display watchdog",
    }.get(fault_verdict(fault), "the CUDA harness failed (not the kernel's doing)")
    where = f"from {fault.call} during {fault.during} of the {label}"
    return f"{what}: {fault.name} ({fault.code}) {where}: {fault.message}"


def import_paths() -> list[str]:
    """Where this process imports from, for the child's isolated interpreter: the project, then sys.path."""
    root = str(Path(engine.__file__).resolve().parent.parent)
    paths = [root, *(entry for entry in sys.path if entry and os.path.isdir(entry))]
    return list(dict.fromkeys(paths))


def child_environment() -> dict[str, str]:
    """The variables the child gets on top of the sandbox's clean environment."""
    env = {name: os.environ[name] for name in PASSED_VARIABLES if os.environ.get(name)}
    env["KF_IMPORT_PATHS"] = os.pathsep.join(import_paths())
    return env


def cuda_isolation(requested: str) -> str:
    """The isolation of the CUDA child: ``auto`` means KF_CUDA_ISOLATION, else a process group of its own.

    Why not namespaces by default: on the H200 machine this was first run on, cuInit failed inside the
    sandbox's namespaced init with CUDA_ERROR_OPERATING_SYSTEM (cuInit under plain ``unshare --net``,
    ``--pid --mount-proc`` or ``--ipc`` worked there; the sandbox's other confinements are the suspects, not
    yet narrowed down), and a judge that cannot start judges nothing. The
    namespaces guard against host code, and the candidate here is device code only: it makes no system
    calls; the host code in the child is ours. Operators whose driver works inside namespaces can ask for
    them with KF_CUDA_ISOLATION=namespaces."""
    if requested != "auto":
        return requested
    return settings().cuda_isolation


def child_limits(wall_seconds: float) -> SandboxLimits:
    """The child's limits: the wall clock and CPU time, no address-space limit (see the module docstring)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)  # RLIM_INFINITY unless this process is limited itself
    return SandboxLimits(
        wall_seconds=wall_seconds,
        cpu_seconds=int(wall_seconds + 60),
        address_space_bytes=hard,
        file_size_bytes=256 << 20,  # CuPy's kernel cache in the private directory
    )


class CudaChild:
    """One sandboxed CUDA child serving the contenders of one validation or benchmark."""

    def __init__(
        self,
        contenders: list[tuple[m.ContenderSpec, bytes]],
        params: list[p.ParamSpec],
        *,
        limits: SandboxLimits,
        problem_folder: Path | None = None,
        isolation: str = "auto",
        driver_module: str = DEFAULT_DRIVER,
        library_module: str = "cupy",
    ) -> None:
        """Start the child and wait until it is ready (``ready``); ``contenders`` are (spec, cubin) pairs, the
        cubin empty for the library; ``driver_module`` and ``library_module`` are the CUDA driver API and the
        library the child uses (tests name CPU doubles). Raises Failed when it cannot start (a verdict of the
        harness, or of the contender whose module did not load), SandboxFailure when the sandbox itself failed."""
        self.labels = [spec.label for spec, _ in contenders]
        self.limits = limits
        self.exited: SandboxOutcome | None = None
        self._handle: SandboxProcess | None = None
        self.commands = self.replies = -1
        # Whether the command in flight runs contenders' device code, and whose (None: several, interleaved).
        self.running_kernel = False
        self.in_flight: int | None = None
        self.sandbox = Sandbox(
            threads=1,
            isolation=cuda_isolation(isolation),
            cpus=sorted(os.sched_getaffinity(0)),
            unprivileged=False,
            env=child_environment(),
        )
        try:
            self._launch()
            cubins = [cubin for _, cubin in contenders]
            plan = m.CudaPlan(
                params=params,
                contenders=[spec for spec, _ in contenders],
                problem_folder=str(problem_folder) if problem_folder is not None else None,
                driver_module=driver_module,
                library_module=library_module,
                payload_bytes=sum(len(c) for c in cubins),
            )
            self.post(plan, *cubins, what="loading")
            reply, _ = self.collect(timeout=START_TIMEOUT_S, what="loading")
            if not isinstance(reply, m.CudaReady):
                raise self._harness(f"the CUDA child answered its plan with {reply.kind}")
            self.ready: m.CudaReady = reply
        except BaseException:
            self.discard()
            raise

    # -- process ---------------------------------------------------------------------------------------

    def _launch(self) -> None:
        commands_r, self.commands = os.pipe()
        self.replies, replies_w = os.pipe()
        command = [sys.executable, "-I", str(CUDA_WORKER), str(commands_r), str(replies_w)]
        try:
            self._handle = self.sandbox.start(
                command, self.limits, pass_fds=(commands_r, replies_w), late_drop=False, pin=False
            )
        finally:
            for fd in (commands_r, replies_w):
                os.close(fd)  # the child has its copies; EOF on replies now means it died

    @property
    def handle(self) -> SandboxProcess:
        assert self._handle is not None, "the CUDA child was not started"
        return self._handle

    @property
    def isolation(self) -> str:
        return str(self.sandbox.isolation)

    def post(self, command: BaseModel, *payload: bytes | memoryview, what: str = "a call") -> None:
        """Send one command without waiting for its reply (:meth:`collect` reads it)."""
        self.running_kernel = isinstance(command, m.CudaTrial | m.CudaWarm | m.CudaRounds)
        self.in_flight = command.contender if isinstance(command, m.CudaTrial | m.CudaWarm) else None
        try:
            p.write_message(self.commands, command, *payload)
        except BrokenPipeError:
            raise self._died(what) from None

    def collect(self, *, timeout: float, what: str = "a call") -> tuple[m.Reply, bytearray]:
        """The reply to the command posted last; Failed for a fault, a hang or a death."""
        try:
            reply, data = p.read_message(self.replies, m.REPLIES, time.monotonic() + timeout, what="reply")
        except (BrokenPipeError, p.ChannelClosed):
            raise self._died(what) from None
        except p.ChannelTimeout:
            if not self.running_kernel:
                raise self._harness(f"the CUDA child did not answer within {timeout:g}s during {what}") from None
            self._kill()
            raise Failed(
                Verdict.timeout,
                "timeout",
                f"stopped: {what} ran longer than {timeout:g}s (a kernel that never finishes, or one far too slow)",
                who=self._who(self.in_flight),
            ) from None
        except p.ProtocolError as error:
            raise self._harness(f"the CUDA child's reply could not be read: {error}") from None
        if p.pending(self.replies):
            raise self._harness(f"a second reply followed {reply.kind}: the CUDA child broke the protocol")
        if isinstance(reply, m.Fault):
            who = self._who(reply.contender)
            raise Failed(fault_verdict(reply), "cuda_fault", fault_message(reply, who), who=who)
        if isinstance(reply, p.Failure):
            raise self._harness(f"the CUDA child failed during {what}: {reply.message}")
        self.running_kernel = False
        return reply, data

    def request(
        self, command: BaseModel, *payload: bytes | memoryview, timeout: float, what: str = "a call"
    ) -> tuple[m.Reply, bytearray]:
        """Send one command and read its one reply."""
        self.post(command, *payload, what=what)
        return self.collect(timeout=timeout, what=what)

    def _who(self, contender: int | None) -> str:
        """The label of the contender a failure belongs to."""
        # Without a contender (a hang, a fault surfacing in interleaved rounds after every contender's warm-up
        # on the shape passed) it is the candidate's: it is the one on trial, the references were judged before.
        return self.labels[contender] if contender is not None else self.labels[0]

    # -- endings ---------------------------------------------------------------------------------------

    def _kill(self) -> None:
        if self._handle is not None:
            self._handle.kill()

    def _finish(self) -> SandboxOutcome:
        if self.exited is None:
            self.exited = self.handle.finish()
            if self.exited.setup_error:
                raise SandboxFailure(self.exited.setup_error)
        return self.exited

    def _harness(self, detail: str) -> Failed:
        self._kill()
        try:
            tail = self._finish().output_tail.strip()[-1500:]
        except SandboxFailure as error:
            tail = str(error)
        return Failed(Verdict.harness_error, "harness", f"{detail}" + (f"; child output: {tail}" if tail else ""))

    def _died(self, what: str) -> Failed:
        try:
            self.handle.wait(timeout=10)
        except Exception:  # a child that will not die is killed
            self._kill()
        return self._classify(self._finish(), what)

    def _classify(self, outcome: SandboxOutcome, what: str) -> Failed:
        """The verdict of a child that ended before it was told to."""
        tail = outcome.output_tail.strip()[-1500:]
        if outcome.killed:
            return Failed(Verdict.timeout, "timeout", f"stopped: {outcome.killed}", who=self._who(self.in_flight))
        signum = outcome.signal
        if signum is not None:
            name = _signal_name(signum)
            if signum == signal.SIGXCPU:
                return Failed(Verdict.timeout, "timeout", f"CPU-time limit of {self.limits.cpu_seconds}s reached")
            if signum in KERNEL_SIGNALS and self.running_kernel:
                return Failed(
                    Verdict.crash,
                    "signal",
                    f"the CUDA child died from {name} during {what}, while a kernel ran: {tail[-300:]}",
                    signum,
                    who=self._who(self.in_flight),
                )
            return Failed(
                Verdict.harness_error,
                "signal",
                f"the CUDA child was killed by {name} during {what} (from outside, or in the harness's own code); "
                f"not the kernel's verdict: {tail[-300:]}",
                signum,
            )
        return Failed(
            Verdict.harness_error,
            "exit",
            f"the CUDA child exited (status {outcome.exit_code}) during {what}: {tail or 'no output'}",
        )

    def close(self) -> SandboxOutcome:
        """Tell the child to finish and collect how it ended; raises :class:`Failed` when it does not end as told
        (it died, hung or answered something else): results taken from such a process are not a verdict."""
        if self.exited is None:
            reply, _ = self.request(p.Finish(), timeout=30, what="finishing")
            if not isinstance(reply, p.Bye):
                raise self._harness(f"the CUDA child answered Finish with {reply.kind}")
            self._finish()
        assert self.exited is not None
        return self.exited

    def discard(self) -> None:
        """Kill the child if it still runs, remove the sandbox, close the pipes (always call, in ``finally``)."""
        try:
            if self.exited is None and self._handle is not None:
                self._kill()
                self._finish()
        except SandboxFailure:
            pass
        finally:
            for fd in (self.commands, self.replies):
                try:
                    if fd >= 0:
                        os.close(fd)
                except OSError:
                    pass
            self.commands = self.replies = -1
            self.sandbox.close()

    def output_tail(self) -> str:
        return self.exited.output_tail[-2000:] if self.exited is not None else ""


class ModuleTrials:
    """A TrialRunner's channel (engine/harness/validation.py) to one module contender of the child: each Trial
    goes out with the launch of its shape."""

    def __init__(self, child: CudaChild, contender: int, launches: dict[str, m.LaunchDims]) -> None:
        """``launches``: the launch per shape, keyed by :func:`shape_key`."""
        self.child = child
        self.contender = contender
        self.launches = launches

    def post(self, command: BaseModel, *payload: bytes | memoryview, what: str = "a call") -> None:
        if not isinstance(command, p.Trial):
            raise TypeError(f"a module's trials carry Trial commands, not {type(command).__name__}")
        launch = self.launches[shape_key(command.shape)]
        wrapped = m.CudaTrial(
            contender=self.contender, launch=launch, trial=command, payload_bytes=command.payload_bytes
        )
        self.child.post(wrapped, *payload, what=what)

    def collect(self, *, timeout: float, what: str = "a call") -> tuple[BaseModel, bytearray]:
        return self.child.collect(timeout=timeout, what=what)


def shape_key(shape: dict[str, int]) -> str:
    """A shape as a dictionary key."""
    return ",".join(f"{k}={v}" for k, v in sorted(shape.items()))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
