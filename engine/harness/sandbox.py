"""The sandbox every candidate (and its compiler) runs in: a crash, a hang or a hostile kernel costs one
verdict, never the calling process.

A :class:`Sandbox` is a private directory plus the means to run a command in it under
``engine/harness/child.py init``, which applies the limits below and starts the command:

- resource limits: address space (``RLIMIT_AS``), CPU seconds (``RLIMIT_CPU``: SIGXCPU, then SIGKILL),
  file size (``RLIMIT_FSIZE``), processes (``RLIMIT_NPROC``), no core dumps;
- a wall-clock limit enforced by this process, which kills the whole process group;
- a clean environment: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and the thread-count variables
  (``OMP_NUM_THREADS``… = the thread budget), never the caller's API keys or tokens;
- a private temporary directory (``HOME`` and ``TMPDIR`` point at it), removed afterwards;
- CPU affinity to ``threads`` cores (recorded in the hardware fingerprint);
- a pids cgroup (v1 or v2, where one is writable) bounding processes and threads: ``RLIMIT_NPROC`` never
  binds root, so without the cgroup a fork bomb run as root is stopped only by the namespace and timeout;
  forks the cgroup refused are reported, and whatever is left in it is killed after the run;
- fewer privileges: when this process is root the command runs as ``nobody`` where that user can run
  the command (always for the compiler; for the Python harness only if the venv is readable to it, which a
  venv inside ``/root`` is not), otherwise as uid 0 with every capability dropped (bounding set included)
  and ``no_new_privs`` -- it cannot load modules, mount, use raw devices or bypass file permissions.

Isolation ``namespaces`` (the default where ``unshare`` works: as root, or unprivileged where user
namespaces are allowed) adds ``unshare --net --pid --ipc --fork --kill-child --mount-proc``: no network
(the namespace has only a downed loopback), its own ``/proc`` (no other process's environment is visible),
a private mount namespace in which every mount but the private directory is remounted read-only (so even
uid 0 writes nothing outside it: not the repository, not ``/proc/sys``, not the cgroup files), and the
guarantee that no descendant outlives the verdict -- when the namespace's init exits or is killed, the
kernel kills every process in it, including ones that called ``setsid()``.

Fallback ``process-group`` (no usable ``unshare``): the init runs in a new session and is a child
subreaper, so orphaned descendants are re-parented to it and killed when it exits; on timeout it gets
SIGTERM (it kills its descendants), then the group gets SIGKILL, then a sweep kills any process still
carrying this sandbox's ``KF_SANDBOX_TOKEN`` in its environment (and the pids cgroup, where there is
one, is emptied). What is lost: network isolation; a private view of ``/proc`` (other processes of the
same user, and their environments, are visible); the read-only file system (a candidate running as uid 0
without capabilities can still write files root owns); and the guarantee against a descendant that
escapes the process group (``setsid``), outlives a SIGKILLed init and scrubs its environment, where no
pids cgroup holds it.

Not defended, in either mode: a candidate is native code in the harness's process, so a determined one
could tamper with the harness's timer or its progress log. Correctness is always judged in the parent,
and the roofline bound rejects timings that are physically impossible; see engine/harness/benchmarking.py.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from engine.hardware import pinned_cpus

SANDBOX_INIT = Path(__file__).with_name("init.py")
HARNESS_WORKER = Path(__file__).with_name("worker.py")
UNSHARE_FLAGS = ["--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc"]
OUTPUT_TAIL_BYTES = 4096
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


class Isolation(StrEnum):
    """How a sandbox is isolated; see the module docstring."""

    namespaces = "namespaces"
    process_group = "process-group"


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one command run in a sandbox."""

    wall_seconds: float = 300.0
    cpu_seconds: int = 330
    address_space_bytes: int = 4 << 30
    file_size_bytes: int = 1 << 30
    processes: int = 64


@dataclass
class SandboxOutcome:
    """What became of a command: how it ended, and what the init saw."""

    exit_code: int | None
    signal: int | None
    killed: str | None
    setup_error: str | None
    leftover: int
    output_tail: str
    seconds: float
    isolation: Isolation
    status: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Support:
    isolation: Isolation
    prefix: tuple[str, ...]
    drop_to: tuple[int, int] | None
    reason: str


_support_lock = threading.Lock()
_support: dict[str, _Support] = {}


def _probe_unshare() -> tuple[tuple[str, ...] | None, str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None, "unshare(1) not found"
    variants = [[unshare, *UNSHARE_FLAGS]]
    if os.geteuid() != 0:
        variants = [[unshare, "--user", "--map-root-user", *UNSHARE_FLAGS]]
    reasons = []
    for prefix in variants:
        try:
            run = subprocess.run(
                [*prefix, "true"], capture_output=True, text=True, timeout=20, check=False, env={"PATH": SAFE_PATH}
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            reasons.append(str(error))
            continue
        if run.returncode == 0:
            return tuple(prefix), "unshare works"
        reasons.append(run.stderr.strip() or f"exit {run.returncode}")
    return None, "; ".join(reasons)


def _unprivileged_ids() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def isolation_support(requested: str = "auto") -> _Support:
    """What this machine allows, probed once per process: namespaces or the fallback, and the uid drop."""
    with _support_lock:
        if requested in _support:
            return _support[requested]
        prefix, reason = (None, "process-group isolation requested")
        if requested in ("auto", Isolation.namespaces):
            prefix, reason = _probe_unshare()
            if prefix is None and requested == Isolation.namespaces:
                raise RuntimeError(f"namespace isolation unavailable: {reason}")
        isolation = Isolation.namespaces if prefix else Isolation.process_group
        support = _Support(isolation, prefix or (), _unprivileged_ids(), reason)
        _support[requested] = support
    if support.drop_to is not None and not _drop_works(support):
        support = _Support(support.isolation, support.prefix, None, support.reason + "; uid drop unusable")
        with _support_lock:
            _support[requested] = support
    return support


def _drop_works(support: _Support) -> bool:
    """Can the unprivileged user run this Python with numpy (the venv may live in an unreadable home)?"""
    probe = Sandbox(support=support, unprivileged=True)
    try:
        outcome = probe.run(
            [sys.executable, "-I", "-c", "import numpy"], SandboxLimits(wall_seconds=60, cpu_seconds=60)
        )
    finally:
        probe.close()
    return outcome.exit_code == 0


@functools.lru_cache(maxsize=1)
def pids_cgroup_root() -> Path | None:
    """A pids-controller cgroup directory we may create children in (cgroup v1 or v2), or None."""
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").is_file() and os.access(v1, os.W_OK):
        return v1
    try:
        own = next(
            line.split("::", 1)[1].strip()
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
    except (OSError, StopIteration):
        return None
    v2 = Path("/sys/fs/cgroup") / own.lstrip("/")
    try:
        if "pids" in (v2 / "cgroup.subtree_control").read_text().split() and os.access(v2, os.W_OK):
            return v2
    except OSError:
        pass
    return None


class _PidsCgroup:
    """A pids cgroup for one run: bounds processes + threads (even for uid 0) and sweeps what is left."""

    def __init__(self, root: Path, name: str, limit: int) -> None:
        self.path = root / name
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(limit))

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def refused_forks(self) -> int:
        """How many forks or thread creations the limit refused."""
        try:
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def sweep_and_remove(self) -> int:
        """SIGKILL every process still in the cgroup, then remove it; return how many were killed."""
        killed = 0
        for _ in range(200):
            try:
                pids = [int(p) for p in self.procs.read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
            time.sleep(0.005)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)  # the last tasks are still exiting (many, slowly, on a loaded machine)
        return killed


def _remove_stale_cgroups(root: Path) -> None:
    """Remove empty ``kf-<pid>-…`` cgroups whose creating process is gone (it died mid-run), and empty
    ones without a pid in their name (an older naming) untouched for an hour. A cgroup with tasks in it
    cannot be removed, so a run in progress is never disturbed."""
    for path in root.glob("kf-*"):
        parts = path.name.split("-")
        if len(parts) < 3 or not parts[1].isdigit():
            try:
                if time.time() - path.stat().st_mtime > 3600:
                    path.rmdir()
            except OSError:
                pass
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue  # its creator is alive: maybe in use
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            path.rmdir()
        except OSError:
            pass


_janitor_lock = threading.Lock()
_janitor_ran = False


def _janitor_due() -> bool:
    """True once per process: the first sandbox run tidies cgroups left by processes that died."""
    global _janitor_ran
    with _janitor_lock:
        due, _janitor_ran = not _janitor_ran, True
    return due


def _scratch_base() -> str:
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 << 30:
            return str(shm)
    except OSError:
        pass
    return tempfile.gettempdir()


def _processes_of(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid == uid:
                count += 1
        except OSError:
            continue
    return count


def sweep_token(token: str) -> int:
    """SIGKILL every process whose environment carries ``KF_SANDBOX_TOKEN=token``; return how many."""
    needle = f"KF_SANDBOX_TOKEN={token}".encode()
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


class CpuLease:
    """CPUs reserved for one sandbox among all sandboxes on this machine, in any process: an exclusive
    ``flock`` on one file per CPU. Two benchmarks pinned to the same core would time each other's
    preemptions; a lease keeps them apart. When fewer CPUs are free than asked for within ``wait_s``, the
    lease takes the preferred ones anyway and says so (``exclusive`` False)."""

    DIRECTORY = Path(tempfile.gettempdir()) / "kf-cpu-leases"

    def __init__(self, threads: int, *, wait_s: float = 0.0) -> None:
        preference = pinned_cpus(len(os.sched_getaffinity(0)))[::-1]  # the last CPUs first (CPU 0 takes IRQs)
        if threads > len(preference):
            pinned_cpus(threads)  # raises with the message naming the CPUs available
        self._files: list[Any] = []
        chosen: list[int] = []
        deadline = time.monotonic() + wait_s
        self.DIRECTORY.mkdir(exist_ok=True)
        while True:
            for cpu in preference:
                if len(chosen) < threads and cpu not in chosen and self._try(cpu):
                    chosen.append(cpu)
            if len(chosen) == threads or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        self.exclusive = len(chosen) == threads
        chosen += [cpu for cpu in preference if cpu not in chosen][: threads - len(chosen)]
        self.cpus = sorted(chosen)

    def _try(self, cpu: int) -> bool:
        handle = open(self.DIRECTORY / f"cpu{cpu}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._files.append(handle)
        return True

    def release(self) -> None:
        for handle in self._files:
            handle.close()
        self._files.clear()


class Sandbox:
    """A private directory and the isolated runner of commands in it. Use as a context manager."""

    def __init__(
        self,
        *,
        threads: int = 1,
        isolation: str = "auto",
        support: _Support | None = None,
        cpus: Sequence[int] | None = None,
        unprivileged: bool | None = None,
        pin: bool = True,
        exclusive_wait_s: float = 0.0,
    ) -> None:
        """``unprivileged``: run commands as ``nobody`` (when this process is root). None: only where that
        user can run this Python and numpy (probed); True: always, for commands that need neither (the
        compiler). ``pin``: lease ``threads`` CPUs (``cpus`` to choose them), waiting up to
        ``exclusive_wait_s`` for ones no other sandbox holds; False: any CPU (the compiler)."""
        self.support = support or isolation_support(isolation)
        self.drop_to = self.support.drop_to if unprivileged is None else (_unprivileged_ids() if unprivileged else None)
        self.threads = threads
        self.lease: CpuLease | None = None
        if cpus is not None:
            self.cpus = list(cpus)
        elif pin:
            self.lease = CpuLease(threads, wait_s=exclusive_wait_s)
            self.cpus = self.lease.cpus
        else:
            self.cpus = sorted(os.sched_getaffinity(0))
        self.token = secrets.token_hex(8)
        self.runs = 0
        self.dir = Path(tempfile.mkdtemp(prefix="kf-sandbox-", dir=_scratch_base()))
        if self.drop_to is not None:
            os.chown(self.dir, *self.drop_to)
        os.chmod(self.dir, 0o700)

    @property
    def isolation(self) -> Isolation:
        return self.support.isolation

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def exclusive(self) -> bool:
        """True when no other sandbox on this machine holds this sandbox's CPUs."""
        return self.lease.exclusive if self.lease is not None else False

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()
        shutil.rmtree(self.dir, ignore_errors=True)

    def environment(self) -> dict[str, str]:
        """The command's whole environment: nothing of the caller's leaks in."""
        n = str(self.threads)
        env = {
            "PATH": SAFE_PATH,
            "HOME": str(self.dir),
            "TMPDIR": str(self.dir),
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": n,
            "OPENBLAS_NUM_THREADS": n,
            "MKL_NUM_THREADS": n,
            "BLIS_NUM_THREADS": n,
            "NUMEXPR_NUM_THREADS": n,
            "VECLIB_MAXIMUM_THREADS": n,
            # Idle OpenMP workers sleep instead of spinning, so they are not "running after return".
            "OMP_WAIT_POLICY": "PASSIVE",
        }
        if self.isolation == Isolation.process_group:
            env["KF_SANDBOX_TOKEN"] = self.token
        return env

    def worker_command(self, *args: str) -> list[str]:
        """The harness worker (engine/harness/child.py) as a command for :meth:`run`."""
        return [sys.executable, "-I", str(HARNESS_WORKER), *args]

    def run(
        self,
        command: Sequence[str],
        limits: SandboxLimits,
        *,
        watch: Callable[[], str | None] | None = None,
        poll_s: float = 0.02,
    ) -> SandboxOutcome:
        """Run ``command`` in the sandbox until it ends, ``limits.wall_seconds`` pass, or ``watch`` (called
        every ``poll_s``) returns a reason to stop it. Never raises for anything the command does."""
        status_path = self.dir / "init-status.json"
        status_path.unlink(missing_ok=True)
        nproc = 0
        if self.drop_to is not None:
            nproc = _processes_of(self.drop_to[0]) + limits.processes
        elif os.geteuid() != 0:
            nproc = _processes_of(os.geteuid()) + limits.processes
        init = [
            sys.executable,
            "-I",
            "-S",
            str(SANDBOX_INIT),
            "--status",
            str(status_path),
            "--as-bytes",
            str(limits.address_space_bytes),
            "--cpu-seconds",
            str(limits.cpu_seconds),
            "--fsize-bytes",
            str(limits.file_size_bytes),
            "--nproc",
            str(nproc),
            "--cpus",
            ",".join(str(c) for c in self.cpus),
        ]
        if self.drop_to is not None:
            init += ["--uid", str(self.drop_to[0]), "--gid", str(self.drop_to[1])]
        else:
            init += ["--drop-capabilities"]
        if self.isolation == Isolation.namespaces:
            init += ["--read-only-except", str(self.dir)]
        cgroup_root = pids_cgroup_root()
        self.runs += 1
        cgroup = None
        if cgroup_root is not None:
            if _janitor_due():
                _remove_stale_cgroups(cgroup_root)
            try:
                name = f"kf-{os.getpid()}-{self.token}-{self.runs}"
                cgroup = _PidsCgroup(cgroup_root, name, limits.processes + 4 * self.threads)
                init += ["--cgroup-procs", str(cgroup.procs)]
            except OSError:
                cgroup = None
        full = [*self.support.prefix, *init, "--", *command]
        started = time.perf_counter()
        killed: str | None = None
        log_path = self.dir / "output.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                full,
                cwd=self.dir,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            while True:
                try:
                    process.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.perf_counter() - started > limits.wall_seconds:
                    killed = f"wall-clock limit of {limits.wall_seconds:.0f}s reached"
                elif watch is not None:
                    killed = watch()
                if killed:
                    self._kill(process)
                    break
        except BaseException:
            self._kill(process)
            raise
        finally:
            refused = cgroup.refused_forks() if cgroup is not None else 0
            swept = cgroup.sweep_and_remove() if cgroup is not None else 0
            if self.isolation == Isolation.process_group:
                swept += sweep_token(self.token)
        seconds = time.perf_counter() - started
        status = _read_status(status_path)
        status["swept"] = swept
        status["refused_forks"] = refused
        return SandboxOutcome(
            exit_code=status.get("exit_code"),
            signal=status.get("signal"),
            killed=killed,
            setup_error=status.get("setup_error"),
            leftover=int(status.get("leftover") or 0),
            output_tail=_tail(log_path),
            seconds=seconds,
            isolation=self.isolation,
            status=status,
        )

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        if self.isolation == Isolation.process_group:
            # The init kills its (re-parented) descendants on SIGTERM; the group kill is the backstop.
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=1.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _read_status(path: Path) -> dict[str, Any]:
    try:
        status: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return status


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - OUTPUT_TAIL_BYTES))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def describe_isolation() -> str:
    """One line for logs and reports: which isolation this machine gives candidates, and why."""
    support = isolation_support()
    user = f"as uid {support.drop_to[0]}" if support.drop_to else "as the calling user"
    return f"{support.isolation} ({support.reason}), {user}"
