"""The parent's side of one sandboxed worker: start it, talk to it, time it, and say what became of it.

A :class:`Contender` is one process running one contender (the candidate, the incumbent, a seed, or the
problem's numpy baseline) in a sandbox of its own. Benchmarking starts one per contender on the same CPUs
and interleaves them, so nothing a candidate can still do reaches the others: it cannot open files or
start processes (seccomp), it writes nothing outside its own private folder, and while another contender
is timed it is stopped (SIGSTOP), every thread of it.

The clock is here. :meth:`Contender.timed_batch` reads the parent's monotonic clock, writes Go, and reads the
clock again when Done arrives; the child's own figure is kept only as a diagnostic. Each reply must echo
its command (a batch's random nonce), and a second reply nobody asked for is a protocol violation: a
candidate writing into the worker's descriptors is caught, not believed.

After every reply the parent looks at the worker from outside (/proc through psutil): threads the candidate
left behind (running ones, or more than its thread budget), children, a changed CPU affinity. The child
cannot hide from that view. At the end it must answer Finish with Bye: a worker that died or hung after its
last reply (a thread the candidate left asleep, memory it corrupted) fails the contender (:meth:`close`).
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import psutil
from pydantic import BaseModel

from engine.errors import UserError
from engine.harness import protocol as p
from engine.harness.cpu import artifact_path, harness_shim
from engine.harness.sandbox import HARNESS_WORKER, Sandbox, SandboxLimits, SandboxOutcome, SandboxProcess
from engine.harness.screen import screen_library
from engine.harness.starvation import (
    MIN_SAMPLES,
    SAMPLE_INTERVAL_S,
    STARVED_PATIENCE,
    CpuTime,
    Watch,
    since,
)
from engine.harness.tripwire import tripped_event
from engine.harness.verdicts import Verdict
from engine.outages import KERNEL_SIGNALS
from engine.problems import DTYPES, Problem

# A fatal signal with the address space within this fraction of its limit is an allocation that failed:
# a worker normally uses well under half of it (the limit is several times the largest trial).
MEMORY_MARGIN_FRACTION = 0.25
# How long the worker may take to start: interpreter, numpy, the problem module, the library.
START_TIMEOUT_S = 60.0


class ArtifactNotFound(UserError):
    """An artifact id with no compiled library in this machine's cache: the machine's problem, not the kernel's."""


class SandboxFailure(RuntimeError):
    """The sandbox itself could not be set up: the machine's fault, not the candidate's (retry elsewhere)."""


@dataclass
class Failed(Exception):
    """The contender's process did something that ends its evaluation: the verdict and its evidence."""

    verdict: Verdict
    check: str
    message: str
    signal: int | None = None
    who: str = "candidate"
    """The contender whose worker failed (its label)."""

    def __str__(self) -> str:
        return f"{self.verdict}: {self.message}"


class Contender:
    """One sandboxed worker process serving one contender; see the module docstring."""

    def __init__(
        self,
        problem: Problem,
        *,
        label: str,
        kind: Literal["artifact", "numpy", "none"],
        artifact_id: str | None = None,
        threads: int,
        cpus: list[int],
        limits: SandboxLimits,
        cache_dir: Path | None,
        isolation: str = "auto",
        problem_py: bool = False,
        pool_fd: int | None = None,
        wait: bool = True,
    ) -> None:
        """Start the worker; with ``wait`` False, return once it is started and call :meth:`wait_ready`
        later (several workers then start in parallel)."""
        self.problem = problem
        self.label = label
        self.threads = threads
        self.cpus = cpus
        self.limits = limits
        self.stopped = False
        self.exited: SandboxOutcome | None = None
        self.worker_pid: int | None = None
        # The worker's CPU time when the command now awaited was sent (a deadline the machine made it miss is no
        # verdict of the kernel's: engine/harness/starvation.py).
        self.sent: CpuTime | None = None
        self.watch: Watch | None = None
        self.baseline_threads: set[int] = set()
        self.uid: int | None = None
        self.commands = self.replies = self.fatal = -1
        self.pool_fd = pool_fd
        # The most payload the reply now awaited may announce (see _reply_bytes), and the shape of the pools.
        self.reply_limit = 0
        self.prepared_shape: dict[str, int] | None = None
        # This process's own count of the calls it asked for on the prepared pools, and which of them the last
        # batch kept: what a fetched output must say it is (engine/harness/benchmarking.py check_timed_output),
        # whatever the kernel's process keeps count of.
        self.calls_asked = 0
        self.kept_call = -1
        self._handle: SandboxProcess | None = None
        self.sandbox = Sandbox(threads=threads, isolation=isolation, cpus=cpus)
        self.dir = self.sandbox.dir
        try:
            library = self._add_library(artifact_id, cache_dir) if kind == "artifact" else None
            shim = harness_shim(cache_dir)
            if shim is not None:
                shutil.copyfile(shim, self.dir / "kf_shim.so")
            if problem_py:
                shutil.copyfile(problem.folder / "problem.py", self.dir / "problem.py")
            self.plan = p.Plan(
                entry=problem.entry,
                params=[
                    p.ParamSpec(name=q.name, role=q.role, dtype=q.dtype, shape=list(q.shape), vary=q.vary)
                    for q in problem.params
                ],
                contender=kind,
                library=library,
                problem_py="problem.py" if problem_py else None,
                shim="kf_shim.so" if shim is not None else None,
                threads=threads,
                drop_to=self.sandbox.late_drop,
                warm_up=p.WarmUp(shape=problem.validation_shapes[0], distribution=problem.distributions[0])
                if problem_py
                else None,
                pool_fd=pool_fd,
                cpus=list(cpus),
            )
            self._launch()
            if wait:
                self.wait_ready()
        except Failed as failed:
            failed.who = label
            self.discard()
            raise
        except BaseException:
            self.discard()
            raise

    def _add_library(self, artifact_id: str | None, cache_dir: Path | None) -> str:
        """Copy the artifact into the sandbox, screened again just before it is ever loaded: a library that
        reached the cache some other way (or was altered there) meets the same rules as a fresh build."""
        if artifact_id is None:
            raise ValueError(f"contender {self.label!r} is an artifact without an artifact id")
        source = artifact_path(artifact_id, cache_dir)
        if not source.is_file():
            raise ArtifactNotFound(
                f"artifact {artifact_id} is not in this machine's cache ({source}); compile the source here "
                "first (engine.harness.cpu.compile_source)"
            )
        name = f"{self.label}.so"
        shutil.copyfile(source, self.dir / name)
        os.chmod(self.dir / name, 0o644)
        # The copy is what gets loaded, so the copy is what gets screened: no window between the two.
        screen = screen_library(self.dir / name)
        if not screen.ok:
            raise Failed(Verdict.forbidden, "screen", screen.violations[0].message)
        return name

    # -- process ---------------------------------------------------------------------------------------

    def _launch(self) -> None:
        commands_r, self.commands = os.pipe()
        self.replies, replies_w = os.pipe()
        self.fatal, fatal_w = os.pipe()
        os.set_blocking(self.fatal, False)
        command = self.sandbox.worker_command(str(commands_r), str(replies_w), str(fatal_w))
        try:
            extra = (self.pool_fd,) if self.pool_fd is not None else ()
            self._handle = self.sandbox.start(
                command, self.limits, pass_fds=(commands_r, replies_w, fatal_w, *extra), pin=False
            )
        finally:
            for fd in (commands_r, replies_w, fatal_w):
                os.close(fd)  # the child has its copies; EOF on replies now means it died
        self.post(self.plan, what="loading")

    def wait_ready(self) -> None:
        """Wait until the worker has loaded its contender and confined itself. On failure the caller discards
        it (the constructor does, for ``wait`` True)."""
        try:
            self._wait_ready()
        except Failed as failed:
            failed.who = self.label
            raise

    def _wait_ready(self) -> None:
        ready, _ = self.collect(timeout=START_TIMEOUT_S, what="loading")
        if isinstance(ready, p.Failure):
            raise Failed(Verdict.crash, "load", f"the library could not be loaded: {ready.message}")
        if not isinstance(ready, p.Ready):
            raise self._protocol(f"answered the plan with {ready.kind}")
        self.uid = ready.uid
        if self.plan.drop_to is not None and ready.uid == 0:
            raise SandboxFailure("the worker did not drop root privileges before loading the candidate")
        self.worker_pid = self._find_worker()
        if self.worker_pid is not None:
            self.watch = Watch(self.worker_pid)
            self.baseline_threads = {t.id for t in psutil.Process(self.worker_pid).threads()}

    @property
    def handle(self) -> SandboxProcess:
        assert self._handle is not None, "the worker was not started"
        return self._handle

    def _find_worker(self) -> int | None:
        try:
            # [python, -I, worker.py, ...]: the init's own command line names the worker too, after "--".
            for process in [psutil.Process(self.handle.pid), *psutil.Process(self.handle.pid).children(recursive=True)]:
                if process.cmdline()[2:3] == [str(HARNESS_WORKER)]:
                    return process.pid
        except psutil.Error:
            pass
        return None

    def request(
        self, command: BaseModel, *payload: bytes | memoryview, timeout: float, what: str = "a call"
    ) -> tuple[p.Reply, bytearray]:
        """Send one command and read its one reply; a dead, hung or lying worker raises :class:`Failed`."""
        try:
            return self._request(command, *payload, timeout=timeout, what=what)
        except Failed as failed:
            failed.who = self.label
            raise

    def timed_batch(self, calls: int, timeout: float, keep: int = -1) -> int:
        """Nanoseconds of a batch of ``calls`` calls, by this process's clock, from Go to Done; the output of
        call ``keep`` (from 0; -1 none) is copied aside for Fetch(kept=True)."""
        try:
            return self._timed_batch(calls, timeout, keep)
        except Failed as failed:
            failed.who = self.label
            raise

    def _request(
        self, command: BaseModel, *payload: bytes | memoryview, timeout: float, what: str
    ) -> tuple[p.Reply, bytearray]:
        self.post(command, *payload, what=what)
        return self.collect(timeout=timeout, what=what)

    def post(self, command: BaseModel, *payload: bytes | memoryview, what: str = "a call") -> None:
        """Send one command without waiting for its reply (:meth:`collect` reads it): this process can judge
        the previous reply while the worker runs the next command."""
        self._resume()
        self._mark_sent()
        self.reply_limit = self._reply_bytes(command)
        try:
            p.write_message(self.commands, command, *payload)
        except BrokenPipeError:
            failed = self._died(what)
            failed.who = self.label
            raise failed from None

    def _reply_bytes(self, command: BaseModel) -> int:
        """The most payload the reply to ``command`` can carry: a trial's regions (each array with its guards),
        a fetch's outputs at the prepared shape, nothing for the other commands."""
        params = self.plan.params
        if isinstance(command, p.Trial):
            return sum(_nbytes(q, command.shape) + 2 * command.guard for q in params if q.is_array)
        if isinstance(command, p.PreparePools):
            self.prepared_shape = dict(command.shape)
            self.calls_asked, self.kept_call = 0, -1
        if isinstance(command, p.Fetch) and self.prepared_shape is not None:
            return sum(_nbytes(q, self.prepared_shape) for q in params if q.role in ("out", "inout"))
        return 0

    def collect(self, *, timeout: float, what: str = "a call") -> tuple[p.Reply, bytearray]:
        """The reply to the command posted last."""
        try:
            return self._collect(timeout, what)
        except Failed as failed:
            failed.who = self.label
            raise

    def _collect(self, timeout: float, what: str) -> tuple[p.Reply, bytearray]:
        late = f"stopped: {what} ran longer than {timeout:g}s"
        try:
            reply, data = self._await(timeout, late)
        except (BrokenPipeError, p.ChannelClosed):
            raise self._died(what) from None
        except p.ChannelTimeout:
            raise self._timed_out(late) from None
        except p.ProtocolError as error:
            raise self._protocol(str(error)) from None
        self._after(reply)
        return reply, data

    def _timed_batch(self, calls: int, timeout: float, keep: int) -> int:
        self._resume()
        nonce = secrets.randbits(62)
        go = p.Go(nonce=nonce, calls=calls, keep=keep)
        late = f"stopped: a batch of {calls} call(s) ran past {timeout:g}s"
        self._mark_sent()
        self.reply_limit = 0  # Done carries no payload
        try:
            started = time.perf_counter_ns()
            p.write_message(self.commands, go)
            reply, _ = self._await(timeout, late)
            elapsed = time.perf_counter_ns() - started
        except (BrokenPipeError, p.ChannelClosed):
            raise self._died("a timed batch") from None
        except p.ChannelTimeout:
            raise self._timed_out(late) from None
        except p.ProtocolError as error:
            raise self._protocol(str(error)) from None
        if not isinstance(reply, p.Done) or reply.nonce != nonce:
            raise self._protocol(f"a batch was answered with {reply.kind} and another nonce")
        if 0 <= keep < calls:
            self.kept_call = self.calls_asked + keep
        self.calls_asked += calls
        self._after(reply)
        return elapsed

    def pause(self) -> None:
        """Stop every thread of the worker while other contenders are timed. A single-threaded worker would be
        blocked on its pipe -- unless the candidate took its interpreter over (a kernel can reach the worker's
        Python through libc's dlsym) and had it spin between batches, on the CPU the next contender is timed on."""
        if not self.stopped:
            self._signal_group(signal.SIGSTOP)
            self.stopped = True

    def _resume(self) -> None:
        if self.stopped:
            self._signal_group(signal.SIGCONT)
            self.stopped = False

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.handle.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _after(self, reply: p.Reply) -> None:
        """Checks after every reply: nothing unasked-for on the pipe, and the worker left nothing running."""
        if p.pending(self.replies):
            raise self._protocol(f"a second reply followed {reply.kind}: something else writes to the harness's pipe")
        if self.worker_pid is None or isinstance(reply, p.Bye):
            # After Bye the worker leaves at once (os._exit): it may be gone already, and nothing of it runs on.
            return
        try:
            process = psutil.Process(self.worker_pid)
            # Cheap first (one /proc read); the thread list only when there are more threads than before.
            # Children need no check: the filter refuses fork, and clone without CLONE_THREAD.
            if process.num_threads() > len(self.baseline_threads):
                new = [t.id for t in process.threads() if t.id not in self.baseline_threads]
                if len(new) > self.threads - 1:
                    raise Failed(
                        Verdict.resource_limit,
                        "threads",
                        f"{len(new)} thread(s) the candidate started were still alive after it returned "
                        f"(allowed: {self.threads - 1}); a kernel must finish all its work before returning",
                    )
                time.sleep(0.002)
                busy = [t for t in new if _running(t)]
                if busy:
                    raise Failed(
                        Verdict.resource_limit,
                        "threads",
                        f"{len(busy)} thread(s) the candidate started kept running after it returned; "
                        "work done after the return would escape the timing",
                    )
            affinity = set(os.sched_getaffinity(self.worker_pid))
            if affinity != set(self.cpus):
                raise Failed(
                    Verdict.resource_limit,
                    "affinity",
                    f"the candidate changed its CPU affinity to {sorted(affinity)} (pinned to {sorted(self.cpus)})",
                )
        except (psutil.NoSuchProcess, ProcessLookupError):
            raise self._died("a check after a call") from None

    # -- endings ---------------------------------------------------------------------------------------

    def _await(self, timeout: float, late: str) -> tuple[p.Reply, bytearray]:
        """The reply to the command just sent, within ``timeout`` seconds of it: a worker that misses that is the
        kernel's ``timeout`` -- unless it was ready to run and the machine gave it no CPU. Such a worker gets
        more time, and where the machine never runs it the failure is the machine's (engine/harness/starvation.py).
        A reply begun by the deadline has ``timeout`` more seconds to arrive whole, or raises ChannelTimeout."""
        deadline = time.monotonic() + timeout
        extended = 0
        looks: list[bool] = []
        while not self._readable_looking(deadline, timeout, looks):
            wait = since(self.sent, self.watch.schedule() if self.watch is not None else None, looks)
            looks = []
            if wait is None or not wait.held_by_machine(timeout):
                raise self._timed_out(late)
            if extended == STARVED_PATIENCE:
                self._kill()
                raise Failed(
                    Verdict.harness_error,
                    "timeout",
                    f"{late}: {wait.describe()}; the machine was too busy to run it, which is not the kernel's verdict",
                )
            extended += 1
            deadline = time.monotonic() + timeout
        # Why a fresh deadline: a reply that became readable a microsecond before the deadline must not be cut
        # off half-read for a deadline the worker met.
        return p.read_reply(self.replies, time.monotonic() + timeout, self.reply_limit)

    def _readable_looking(self, deadline: float, timeout: float, looks: list[bool]) -> bool:
        """Wait for the reply until ``deadline``; in the second half of the wait, look at random moments whether
        the worker is ready to run, into ``looks`` (engine/harness/starvation.py). Why only then: a reply that
        comes in time (a batch lasts a twentieth of its deadline or less) is awaited in one select, so the parent
        never wakes up during a timed batch, on a CPU the worker may share."""
        if self.watch is None:
            return p.readable(self.replies, deadline)
        if p.readable(self.replies, deadline - timeout / 2):
            return True
        low, high = SAMPLE_INTERVAL_S
        cap = timeout / 2 / MIN_SAMPLES
        while True:
            now = time.monotonic()
            if now >= deadline:
                return p.readable(self.replies, now)
            if p.readable(self.replies, min(deadline, now + min(_LOOKS.uniform(low, high), cap))):
                return True
            runnable = self.watch.runnable()
            if runnable is not None:
                looks.append(runnable)

    def _mark_sent(self) -> None:
        # One clock_gettime (1-2 us measured): it runs before every command, timed batches included.
        self.sent = self.watch.cpu_time() if self.watch is not None else None

    def _timed_out(self, message: str) -> Failed:
        """Kill a worker that missed its deadline by itself; its failure is the kernel's."""
        self._kill()
        return Failed(Verdict.timeout, "timeout", message)

    def _kill(self) -> None:
        if self._handle is not None:
            self._resume()
            self._handle.kill()

    def _finish(self) -> SandboxOutcome:
        if self.exited is None:
            self._resume()
            self.exited = self.handle.finish()
            if self.exited.setup_error:
                raise SandboxFailure(self.exited.setup_error)
        return self.exited

    def fatal_reports(self) -> list[dict[str, object]]:
        """The fatal-signal reporter's lines (a candidate may have written garbage there too: skipped)."""
        chunks = []
        while True:
            try:
                chunk = os.read(self.fatal, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        reports = []
        for line in b"".join(chunks).splitlines():
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict) and report.get("ev") == "fatal":
                reports.append(report)
        return reports

    def _protocol(self, detail: str) -> Failed:
        self._kill()
        outcome = self._finish()
        if outcome.signal is not None or outcome.killed:
            return self._classify(outcome, "a call")
        return Failed(
            Verdict.forbidden,
            "protocol",
            f"the harness's report pipe carried what the harness did not write ({detail}): the candidate "
            "wrote to a descriptor it inherited",
        )

    def _died(self, what: str) -> Failed:
        try:
            self.handle.wait(timeout=10)
        except Exception:  # a worker that will not die is killed below
            self._kill()
        return self._classify(self._finish(), what)

    def _classify(self, outcome: SandboxOutcome, what: str) -> Failed:
        """The verdict of a worker that ended before it was told to."""
        # The sandbox's init saw how the worker ended; the fatal pipe only adds detail (the fault address, the
        # refused system call, VmPeak). The candidate can write that pipe too, so a report counts only for the
        # signal the worker really died of: a forged SIGKILL report before a plain exit would otherwise pass
        # the kernel's own exit off as the machine's failure, which is never judged.
        signum = outcome.signal
        fatal = next((r for r in self.fatal_reports() if signum is not None and _reported(r) == signum), None)
        limits = self.limits
        if outcome.killed:
            return Failed(Verdict.timeout, "timeout", f"stopped: {outcome.killed}")
        if signum is not None:
            name = _signal_name(signum)
            if signum == signal.SIGSYS:
                call = _syscall(fatal.get("syscall") if fatal else None, fatal.get("syscall_arch") if fatal else None)
                return Failed(
                    Verdict.forbidden,
                    "syscall",
                    f"the sandbox's seccomp filter refused system call {call}: kernels may only compute "
                    "on their arguments (no files, processes, network or signals)",
                    signum,
                )
            peak = int(str(fatal.get("vm_peak_kb", 0))) * 1024 if fatal else 0
            if signum == signal.SIGXCPU:
                return Failed(Verdict.timeout, "timeout", f"CPU-time limit of {limits.cpu_seconds}s reached", signum)
            if signum == signal.SIGXFSZ:
                return Failed(Verdict.resource_limit, "file_size", f"wrote a file past the size limit ({name})", signum)
            if peak >= limits.address_space_bytes * (1 - MEMORY_MARGIN_FRACTION):
                return Failed(
                    Verdict.resource_limit,
                    "memory",
                    f"died from {name} with its address space at {peak >> 20} MiB of the "
                    f"{limits.address_space_bytes >> 20} MiB limit: an allocation failed",
                    signum,
                )
            cpu_seconds = outcome.status.get("cpu_seconds")
            if signum == signal.SIGKILL and isinstance(cpu_seconds, int | float) and cpu_seconds >= limits.cpu_seconds:
                # The hard CPU-time limit: the candidate ignored SIGXCPU (it may set signal handlers) and ran on.
                return Failed(Verdict.timeout, "timeout", f"CPU-time limit of {limits.cpu_seconds}s reached", signum)
            if signum not in KERNEL_SIGNALS:
                # Not a fault, trap, abort or limit of the candidate's own: the OOM killer, an operator or a
                # shutdown killed the sandbox from outside (or the candidate signalled itself; the two cannot be
                # told apart). Nothing the kernel can be shown to have caused: the caller runs it again in a fresh
                # sandbox (activities/search.py) and never records this as the kernel's verdict.
                return Failed(
                    Verdict.harness_error,
                    "signal",
                    f"killed by {name} (signal {signum}) from outside the harness (the OOM killer, an operator or "
                    "a shutdown); not the kernel's verdict",
                    signum,
                )
            address = f" at address {fatal['address']}" if fatal and signum in (signal.SIGSEGV, signal.SIGBUS) else ""
            return Failed(Verdict.crash, "signal", f"crashed with {name} (signal {signum}){address}", signum)
        if outcome.leftover or outcome.status.get("refused_forks"):
            return Failed(
                Verdict.resource_limit, "processes", f"the candidate started processes ({outcome.leftover} left)"
            )
        code = outcome.exit_code
        if code is None:
            # No status line: the sandbox's init, which the candidate cannot reach, died before it could report
            # how the worker ended -- killed from outside (the OOM killer, an operator) with everything in it.
            return Failed(
                Verdict.harness_error,
                "signal",
                f"the sandbox was killed from outside the harness during {what} (no status from its init); "
                "not the kernel's verdict",
            )
        if code == p.EXIT_PROTOCOL:
            return Failed(
                Verdict.forbidden,
                "protocol",
                "the worker's command pipe carried garbage: the candidate read or wrote it",
            )
        if code == p.EXIT_PROBLEM and (self.plan.contender == "numpy" or what == "loading"):
            # Believed only where no candidate code can have run (the numpy reference's worker, or any worker
            # before its library is loaded): a kernel that exits with this status itself would otherwise pass
            # its own crash off as the problem's failure, which is never the kernel's verdict.
            tail = outcome.output_tail
            said = tail[tail.rfind(p.PROBLEM_MARK) + len(p.PROBLEM_MARK) :].strip() if p.PROBLEM_MARK in tail else ""
            return Failed(
                Verdict.harness_error,
                "problem",
                f"problem.py's code failed in the numpy worker during {what}: {said or 'no message'}",
            )
        if code == p.EXIT_INTERPRETER:
            event = tripped_event(outcome.output_tail)
            return Failed(
                Verdict.forbidden,
                "interpreter",
                f"the kernel ran code in the worker's Python interpreter during {what} (audit event "
                f"{event or 'unknown'}): kernels may only compute on their arguments",
            )
        if code == p.EXIT_WORKER_ERROR:
            return Failed(
                Verdict.crash,
                "harness",
                f"the worker failed during {what} after the candidate had run (its memory may be corrupted): "
                f"{outcome.output_tail.strip()[-300:]}",
            )
        return Failed(Verdict.crash, "exit", f"the process exited (status {code}) during {what}")

    def close(self) -> SandboxOutcome:
        """Tell the worker to finish (it leaves with os._exit) and collect how it ended.

        Raises :class:`Failed` when the worker does not end as told: it died, hung or answered something else
        after its last reply. Between replies only the candidate's code can act (a thread it left behind, memory
        it corrupted), so the contender's verdict must not stand on such a process (the failure carries its
        label; a reference's failure is the machine's, as everywhere)."""
        if self.exited is None:
            reply, _ = self.request(p.Finish(), timeout=10, what="finishing")
            if not isinstance(reply, p.Bye):
                failed = self._protocol(f"Finish was answered with {reply.kind}")
                failed.who = self.label
                raise failed
            self._finish()
        assert self.exited is not None
        return self.exited

    def discard(self) -> None:
        """Kill the worker if it still runs, and remove the sandbox (always call, e.g. in ``finally``)."""
        try:
            if self.exited is None and self._handle is not None:
                self._kill()
                self._finish()
        except SandboxFailure:
            pass
        finally:
            for fd in (self.commands, self.replies, self.fatal):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.sandbox.close()


def _running(tid: int) -> bool:
    try:
        return psutil.Process(tid).status() == psutil.STATUS_RUNNING
    except psutil.Error:
        return False


# When the parent looks at a worker that keeps it waiting: drawn here, where no candidate can see the draws.
_LOOKS = random.Random()


def _nbytes(param: p.ParamSpec, shape: dict[str, int]) -> int:
    """Bytes of one array argument at ``shape``."""
    return math.prod(int(shape[d]) for d in param.shape) * np.dtype(DTYPES[param.dtype]).itemsize


def _reported(report: dict[str, object]) -> int | None:
    """The signal a fatal report names, or None when it names none."""
    try:
        return int(str(report.get("signal")))
    except ValueError:
        return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _syscall(number: object, arch: object) -> str:
    if not isinstance(number, int):
        return "(unknown number: a thread start refused before the reporter could run)"
    try:
        from engine.harness.seccomp import syscall_name

        return f"{syscall_name(number, arch=arch if isinstance(arch, int) else None)} ({number})"
    except Exception:  # a name is a courtesy; the number is the evidence
        return f"number {number}"
