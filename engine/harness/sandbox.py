"""The sandbox every candidate (and its compiler) runs in: a crash, a hang or a hostile kernel costs one
verdict, never the calling process.

A :class:`Sandbox` is a private directory plus the means to run a command in it under
``engine/harness/init.py``, which applies the limits below and starts the command:

- resource limits: address space (``RLIMIT_AS``), CPU seconds (``RLIMIT_CPU``: SIGXCPU, then SIGKILL),
  file size (``RLIMIT_FSIZE``), processes (``RLIMIT_NPROC``), no core dumps;
- a wall-clock limit enforced by this process, which kills the whole process group;
- a clean environment: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and the thread-count variables
  (``OMP_NUM_THREADS``… = the thread budget), never the caller's API keys or tokens;
- a private temporary directory (``HOME`` and ``TMPDIR`` point at it), removed afterwards;
- no descriptors but standard input, output and error, and those the caller passes (``pass_fds``);
- CPU affinity to ``threads`` cores (recorded in the hardware fingerprint);
- a pids cgroup (v1 or v2, where one is writable) bounding processes and threads: ``RLIMIT_NPROC`` never
  binds root, so without the cgroup a fork bomb run as root is stopped only by the namespace and timeout;
  forks the cgroup refused are reported, and whatever is left in it is killed after the run;
- no root: see "Privileges" below.

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
same user, and their environments, are visible); the read-only file system (a plain command running as
uid 0 without capabilities can still write files root owns); and the guarantee against a descendant that
escapes the process group (``setsid``), outlives a SIGKILLed init and scrubs its environment, where no
pids cgroup holds it.

Privileges. When this process is root, no command runs as root -- uid 0 passes the owner's permission check
on every file root owns (``/etc/shadow``), capabilities or not:

- a command that needs neither this Python nor numpy (the compiler), or any command where ``nobody`` can
  run this Python and numpy (probed once), runs as ``nobody`` from its first instruction: the init
  becomes that user before it starts the command;
- the harness worker, where ``nobody`` cannot read the interpreter (a venv whose Python lives in
  ``/root/.pyenv``), drops late (:attr:`Sandbox.late_drop`, engine/harness/privileges.py): it starts as
  uid 0 holding only CAP_SETUID and CAP_SETGID (no other capability, bounding set empty), imports what it
  needs, and calls ``drop_privileges(*late_drop)`` before any candidate code is loaded. The private
  directory then belongs to root with the dropped user's group (mode ``1770``): the worker can use it
  before and after the drop, and cannot delete or replace what the supervisor put there;
- any other command runs as uid 0 with every capability dropped (bounding set included) and
  ``no_new_privs`` -- it cannot load modules, mount, use raw devices or bypass file permissions, but it
  can read what root owns, so candidate code must never run that way.

When this process is not root there is nothing to drop to (an unprivileged user namespace maps one uid):
commands run as the calling user, as uid 0 of their namespace without capabilities where there is one.

The sandbox dies with its supervisor. The first process of every run (``unshare``, or the init in the
fallback) gets SIGKILL when the thread that started it dies (``PR_SET_PDEATHSIG``): a SIGKILLed harness
takes its running sandboxes down with it (``--kill-child`` then ends the whole PID namespace; in the
fallback the command has its own parent-death signal, but its escaped descendants do not). A private
directory is named ``kf-sandbox-<supervisor pid>-<token>`` and locked (``flock`` on the directory) for its
lifetime; the first sandbox created in a process removes every such directory in the scratch folders whose
lock nobody holds and whose supervisor pid is not running, killing any process still carrying its token
(and empties stale pids cgroups the same way). A directory of a live supervisor is never touched.

What the sandbox does not decide: a candidate is native code in the worker's process, so anything the
worker holds is within its reach. The judge therefore relies on nothing there: the clock is the parent's,
outputs come back on a pipe and are judged in the parent, and the worker is confined by seccomp before the
library is loaded (engine/harness/driver.py, worker.py, seccomp.py).
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil

from engine.hardware import pinned_cpus
from engine.harness.privileges import PR_SET_PDEATHSIG, libc

SANDBOX_INIT = Path(__file__).with_name("init.py")
HARNESS_WORKER = Path(__file__).with_name("worker.py")
UNSHARE_FLAGS = ["--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc"]
OUTPUT_TAIL_BYTES = 4096
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
PRIVATE_PREFIX = "kf-sandbox-"
TOKEN_VARIABLE = "KF_SANDBOX_TOKEN"


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
    cpu_seconds_at_limit: float | None = None
    """CPU seconds the command's processes had run when the wall-clock limit stopped them (None when it did not,
    or when they could not be read): a command that had little of its limit on a CPU was held back by the machine
    (overloaded, paused, a stalled disk), not by what it was given to do."""


@dataclass(frozen=True)
class _Support:
    isolation: Isolation
    prefix: tuple[str, ...]
    drop_to: tuple[int, int] | None
    """uid, gid the init becomes before it starts a command (this process is root, ``nobody`` can run it)."""
    reason: str
    late_drop: tuple[int, int] | None = None
    """uid, gid the harness worker drops to itself (root, but ``nobody`` cannot start this Python)."""


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
        support = _Support(
            support.isolation,
            support.prefix,
            None,
            support.reason + "; nobody cannot start this Python: the harness worker drops to it late",
            late_drop=support.drop_to,
        )
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
        return _empty_and_remove_cgroup(self.path)


def _empty_and_remove_cgroup(path: Path) -> int:
    """SIGKILL every process in the cgroup at ``path``, then remove it; return how many were killed."""
    killed = 0
    for _ in range(200):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
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
            path.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.01)  # the last tasks are still exiting (many, slowly, on a loaded machine)
    return killed


def _remove_stale_cgroups(root: Path) -> None:
    """Empty and remove ``kf-<pid>-…`` cgroups whose creating process is gone (it died mid-run: what is
    still in one escaped its sandbox, in the fallback), and remove empty ones without a pid in their name
    (an older naming) untouched for an hour. A cgroup of a live process is never disturbed."""
    for path in root.glob("kf-*"):
        parts = path.name.split("-")
        if len(parts) < 3 or not parts[1].isdigit():
            try:
                if time.time() - path.stat().st_mtime > 3600:
                    path.rmdir()
            except OSError:
                pass
            continue
        if not psutil.pid_exists(int(parts[1])):
            _empty_and_remove_cgroup(path)


def _scratch_base() -> str:
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 << 30:
            return str(shm)
    except OSError:
        pass
    return tempfile.gettempdir()


def _scratch_bases() -> list[Path]:
    """Every folder :func:`_scratch_base` may choose (it depends on free space at the time)."""
    return list(dict.fromkeys(Path(base) for base in ("/dev/shm", tempfile.gettempdir()) if Path(base).is_dir()))


def _make_private_directory(base: str, token: str) -> tuple[Path, int]:
    """``kf-sandbox-<this pid>-<token>`` under ``base``, and a descriptor holding its lock for its lifetime.

    Between ``mkdir`` and ``flock`` the directory is unlocked; a sweeper leaves it alone because its pid
    runs (see :func:`sweep_stale_directories`)."""
    path = Path(base) / f"{PRIVATE_PREFIX}{os.getpid()}-{token}"
    os.mkdir(path, 0o700)
    lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return path, lock


def _owner_and_token(name: str) -> tuple[int, str] | None:
    """The supervisor pid and token in a private directory's name; None for any other name."""
    if not name.startswith(PRIVATE_PREFIX):
        return None
    pid, _, token = name.removeprefix(PRIVATE_PREFIX).partition("-")
    if not pid.isdigit() or not token:
        return None
    return int(pid), token


def sweep_stale_directories(bases: Iterable[Path] | None = None) -> list[Path]:
    """Remove the private directories of supervisors that are gone; return the ones removed.

    A directory is stale when nobody holds its lock (its supervisor's descriptor died with it) and no
    process has the pid in its name (a sandbox being created is unlocked for a moment; a reused pid keeps a
    directory a little longer, never the other way round). Processes still carrying its token (escaped in
    the fallback) are killed. Directories named otherwise (an older naming) are left alone."""
    removed = []
    for base in bases if bases is not None else _scratch_bases():
        for path in Path(base).glob(f"{PRIVATE_PREFIX}*"):
            named = _owner_and_token(path.name)
            if named is None:
                continue
            owner, token = named
            try:
                lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # held: its supervisor is alive (in any PID namespace)
                if psutil.pid_exists(owner):
                    continue
                sweep_token(token)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
            finally:
                os.close(lock)
    return removed


_tidy_lock = threading.Lock()
_tidied = False


def _tidy_once() -> None:
    """Once per process, before its first sandbox: remove what sandboxes of dead supervisors left behind."""
    global _tidied
    with _tidy_lock:
        if _tidied:
            return
        _tidied = True
    sweep_stale_directories()
    cgroup_root = pids_cgroup_root()
    if cgroup_root is not None:
        _remove_stale_cgroups(cgroup_root)


def _processes_of(uid: int) -> int:
    """How many processes have ``uid`` as their real uid (what ``RLIMIT_NPROC`` counts)."""
    count = 0
    for process in psutil.process_iter(["uids"]):
        uids = process.info["uids"]
        if uids is not None and uids.real == uid:
            count += 1
    return count


def sweep_token(token: str) -> int:
    """SIGKILL every process whose environment carries ``KF_SANDBOX_TOKEN=token``; return how many."""
    killed = 0
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(TOKEN_VARIABLE) == token:
                process.kill()
                killed += 1
        except psutil.Error:
            continue
    return killed


def _dies_with_this_thread() -> Callable[[], None]:
    """A Popen ``preexec_fn`` (run in the child between fork and exec): the child gets SIGKILL when the
    thread that forked it dies, and dies at once if that already happened.

    Only async-signal-safe work in there: ``prctl`` resolved beforehand, ``getppid``, ``_exit``."""
    prctl = libc().prctl
    supervisor = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != supervisor:
            os._exit(1)

    return arm


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
    """A private directory and the isolated runner of commands in it, one at a time. Use as a context
    manager."""

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
        env: dict[str, str] | None = None,
    ) -> None:
        """``env``: variables added to the clean environment (the CUDA child's CUDA_VISIBLE_DEVICES…; never
        the caller's secrets). ``unprivileged``: run commands as ``nobody`` (when this process is root). None:
        where that user can run this Python and numpy (probed), else the harness worker drops to it late
        (:attr:`late_drop`);
        True: always, for commands that need neither (the compiler); False: never (uid 0 without
        capabilities). ``pin``: lease ``threads`` CPUs (``cpus`` to choose them), waiting up to
        ``exclusive_wait_s`` for ones no other sandbox holds; False: any CPU (the compiler)."""
        self.support = support or isolation_support(isolation)
        _tidy_once()
        self.drop_to: tuple[int, int] | None = None
        """uid, gid the init becomes before it starts any command."""
        self.late_drop: tuple[int, int] | None = None
        """uid, gid the harness worker must pass to ``privileges.drop_privileges`` before it loads candidate
        code (:meth:`worker_command`); None when there is nothing to drop (already dropped, or not root)."""
        if unprivileged is None:
            self.drop_to, self.late_drop = self.support.drop_to, self.support.late_drop
        elif unprivileged:
            self.drop_to = _unprivileged_ids()
        self.threads = threads
        self.extra_env = dict(env or {})
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
        self._running: SandboxProcess | None = None
        try:
            self.dir, self._lock = _make_private_directory(_scratch_base(), self.token)
        except BaseException:
            if self.lease is not None:
                self.lease.release()
            raise
        if self.drop_to is not None:
            os.chown(self.dir, *self.drop_to)
        elif self.late_drop is not None:
            # The worker starts as uid 0 without CAP_DAC_OVERRIDE (the owner's rights) and goes on as the
            # dropped user (the group's rights). Sticky: that user cannot delete or replace the files root
            # put here (the problem module, the libraries, the output log), only its own.
            os.chown(self.dir, 0, self.late_drop[1])
            os.chmod(self.dir, 0o1770)

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
        """Kill a command still running, release the CPUs, remove the private directory. Idempotent."""
        try:
            if self._running is not None and not self._running.finished:
                self._running.kill("the sandbox was closed")
                self._running.finish()
        finally:
            if self.lease is not None:
                self.lease.release()
            shutil.rmtree(self.dir, ignore_errors=True)
            if self._lock >= 0:
                os.close(self._lock)  # only now: a locked directory is never swept
                self._lock = -1

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
        env.update(self.extra_env)
        if self.isolation == Isolation.process_group:
            env[TOKEN_VARIABLE] = self.token
        return env

    def worker_command(self, *args: str) -> list[str]:
        """The harness worker (engine/harness/worker.py) as a command for :meth:`start` or :meth:`run`.

        Started with the late drop where :attr:`late_drop` is set: it then runs as uid 0 holding only
        CAP_SETUID and CAP_SETGID, and must call ``engine.harness.privileges.drop_privileges(*late_drop)``
        after its imports and before it loads any candidate code."""
        return [sys.executable, "-I", str(HARNESS_WORKER), *args]

    def start(
        self,
        command: Sequence[str],
        limits: SandboxLimits,
        *,
        pass_fds: Sequence[int] = (),
        late_drop: bool | None = None,
        pin: bool = True,
    ) -> SandboxProcess:
        """Start ``command`` in the sandbox and return at once; :meth:`SandboxProcess.finish` collects it.

        ``pass_fds``: descriptors of this process the command gets under the same numbers (nothing else
        but standard input, output and error reaches it). ``late_drop``: start it the way the harness
        worker is started (see :attr:`late_drop`); None: exactly when ``command`` is :meth:`worker_command`'s.
        ``pin`` False: the init leaves the CPU affinity alone and the command pins itself (the harness worker
        does, to the CPUs its plan names, before any candidate code can run), so several workers can start
        (import) in parallel before they share their CPUs.

        Call this from a thread that lives until the run is finished: the sandbox is killed when the thread
        that started it exits (that is how it dies with a killed supervisor)."""
        if self._running is not None and not self._running.finished:
            raise RuntimeError(
                f"sandbox {self.dir} is still running pid {self._running.pid}: finish() it before starting "
                "another command"
            )
        if late_drop is None:
            late_drop = list(command[:3]) == self.worker_command()
        late = self.late_drop if late_drop else None
        nproc = 0
        if self.drop_to is not None:
            nproc = _processes_of(self.drop_to[0]) + limits.processes
        elif late is not None:
            nproc = _processes_of(late[0]) + limits.processes
        elif os.geteuid() != 0:
            nproc = _processes_of(os.geteuid()) + limits.processes
        status_read, status_write = os.pipe()
        os.set_blocking(status_read, False)
        init = [
            sys.executable,
            "-I",
            "-S",
            str(SANDBOX_INIT),
            "--status-fd",
            str(status_write),
            "--as-bytes",
            str(limits.address_space_bytes),
            "--cpu-seconds",
            str(limits.cpu_seconds),
            "--fsize-bytes",
            str(limits.file_size_bytes),
            "--nproc",
            str(nproc),
            "--cpus",
            ",".join(str(c) for c in self.cpus) if pin else "",
        ]
        if pass_fds:
            init += ["--pass-fds", ",".join(str(fd) for fd in pass_fds)]
        if self.drop_to is not None:
            init += ["--uid", str(self.drop_to[0]), "--gid", str(self.drop_to[1])]
        elif late is not None:
            init += ["--late-drop"]
        else:
            init += ["--drop-capabilities"]
        if self.isolation == Isolation.namespaces:
            init += ["--read-only-except", str(self.dir)]
        cgroup_root = pids_cgroup_root()
        self.runs += 1
        cgroup = None
        if cgroup_root is not None:
            try:
                name = f"kf-{os.getpid()}-{self.token}-{self.runs}"
                cgroup = _PidsCgroup(cgroup_root, name, limits.processes + 4 * self.threads)
                init += ["--cgroup-procs", str(cgroup.procs)]
            except OSError:
                cgroup = None
        log = None
        try:
            log = self._open_log()
            started = time.perf_counter()
            process = subprocess.Popen(
                [*self.support.prefix, *init, "--", *command],
                cwd=self.dir,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(status_write, *pass_fds),
                # The thread-safety caveat of preexec_fn is about Python code that takes locks; this one
                # makes one system call through a function resolved before the fork.
                preexec_fn=_dies_with_this_thread(),
            )
        except BaseException:
            for fd in (status_read, log):
                if fd is not None:
                    os.close(fd)
            if cgroup is not None:
                cgroup.sweep_and_remove()
            raise
        finally:
            os.close(status_write)
        self._running = SandboxProcess(self, process, limits, started, log=log, status=status_read, cgroup=cgroup)
        return self._running

    def run(
        self,
        command: Sequence[str],
        limits: SandboxLimits,
        *,
        watch: Callable[[], str | None] | None = None,
        poll_s: float = 0.02,
        late_drop: bool | None = None,
    ) -> SandboxOutcome:
        """Run ``command`` in the sandbox until it ends, ``limits.wall_seconds`` pass, or ``watch`` (called
        every ``poll_s``) returns a reason to stop it. Never raises for anything the command does."""
        return self.start(command, limits, late_drop=late_drop).finish(watch=watch, poll_s=poll_s)

    def _open_log(self) -> int:
        """A fresh ``output.log`` for the command's output. A command may have left a link under that name
        (the directory is its own): removed, never followed. This process reads the tail through the same
        descriptor, never through the name."""
        path = self.dir / "output.log"
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


class SandboxProcess:
    """One command running in a sandbox, from :meth:`Sandbox.start` until :meth:`finish` collects it.

    ``pid`` is the sandbox's first process (``unshare``, or the init in the fallback), the leader of its
    own process group; the command is a descendant. Its exit status (``poll``, ``wait``) says only that
    the sandbox ended: how the command ended is in :meth:`finish`'s outcome. The wall-clock limit is
    enforced by :meth:`finish`; a caller that talks to the command before that keeps to
    :attr:`remaining_s` itself."""

    def __init__(
        self,
        sandbox: Sandbox,
        process: subprocess.Popen[bytes],
        limits: SandboxLimits,
        started: float,
        *,
        log: int,
        status: int,
        cgroup: _PidsCgroup | None,
    ) -> None:
        self.sandbox = sandbox
        self.limits = limits
        self.started = started
        self.killed: str | None = None
        """Why :meth:`kill` was told to stop the command (None if it was not, or not given a reason)."""
        self.cpu_seconds_at_limit: float | None = None
        """The command's CPU seconds when the wall-clock limit stopped it (see SandboxOutcome)."""
        self._process = process
        self._log = log
        self._status = status
        self._cgroup = cgroup
        self._outcome: SandboxOutcome | None = None

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` has collected the outcome."""
        return self._outcome is not None

    @property
    def remaining_s(self) -> float:
        """Seconds left of the wall-clock limit (negative once it has passed)."""
        return self.limits.wall_seconds - (time.perf_counter() - self.started)

    def poll(self) -> int | None:
        """None while the sandbox runs, else the exit status of its first process."""
        return self._process.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the sandbox to end; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        return self._process.wait(timeout)

    def kill(self, reason: str | None = None) -> None:
        """Kill the sandbox, the command and every descendant; ``reason`` becomes the outcome's ``killed``."""
        if reason is not None and self.killed is None:
            self.killed = reason
        process = self._process
        if process.poll() is not None:
            return  # reaped: its pid, and so its group id, may already be someone else's
        if self.sandbox.isolation == Isolation.process_group:
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

    def finish(self, *, watch: Callable[[], str | None] | None = None, poll_s: float = 0.02) -> SandboxOutcome:
        """Wait until the command ends, the wall-clock limit passes, or ``watch`` (called every ``poll_s``)
        returns a reason to stop it; then sweep what is left and return the outcome (the same one on every
        later call). Never raises for anything the command does; if interrupted, kills the sandbox first."""
        if self._outcome is not None:
            return self._outcome
        try:
            while True:
                try:
                    self._process.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                reason = None
                if self.remaining_s < 0:
                    reason = f"wall-clock limit of {self.limits.wall_seconds:.0f}s reached"
                    self.cpu_seconds_at_limit = tree_cpu_seconds(self._process.pid)
                elif watch is not None:
                    reason = watch()
                if reason:
                    self.kill(reason)
                    break
        except BaseException:
            self.kill()
            self._collect()
            raise
        return self._collect()

    def _collect(self) -> SandboxOutcome:
        cgroup = self._cgroup
        refused = cgroup.refused_forks() if cgroup is not None else 0
        swept = cgroup.sweep_and_remove() if cgroup is not None else 0
        if self.sandbox.isolation == Isolation.process_group:
            swept += sweep_token(self.sandbox.token)
        seconds = time.perf_counter() - self.started
        status = _read_status(self._status)
        status["swept"] = swept
        status["refused_forks"] = refused
        self._outcome = SandboxOutcome(
            exit_code=status.get("exit_code"),
            signal=status.get("signal"),
            killed=self.killed,
            setup_error=status.get("setup_error"),
            leftover=int(status.get("leftover") or 0),
            output_tail=_tail(self._log),
            seconds=seconds,
            isolation=self.sandbox.isolation,
            status=status,
            cpu_seconds_at_limit=self.cpu_seconds_at_limit,
        )
        os.close(self._status)
        os.close(self._log)
        return self._outcome


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user and system) that process ``pid`` and its descendants have run, those they have already
    waited for included; None where the process is gone or cannot be read. A descendant that left its parent's
    tree (re-parented to an init) is not counted: the commands this is asked about (a compiler) do not do that."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return None
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except (psutil.Error, OSError):
            continue  # ended between the listing and the reading: its parent's children_* count it once reaped
        total += times.user + times.system + times.children_user + times.children_system
    return total


def _read_status(fd: int) -> dict[str, Any]:
    """The init's last whole status line on the (non-blocking) status pipe, or {} if it sent none."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    for line in reversed(b"".join(chunks).splitlines()):
        try:
            status = json.loads(line)
        except ValueError:
            continue
        if isinstance(status, dict):
            return status
    return {}


def _tail(fd: int) -> str:
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, OUTPUT_TAIL_BYTES, max(0, size - OUTPUT_TAIL_BYTES)).decode(errors="replace")
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def describe_isolation() -> str:
    """One line for logs and reports: which isolation this machine gives candidates, and why."""
    support = isolation_support()
    if support.drop_to:
        user = f"as uid {support.drop_to[0]}"
    elif support.late_drop:
        user = f"as uid {support.late_drop[0]} (the harness worker drops to it after its interpreter starts)"
    else:
        user = "as the calling user without capabilities"
    return f"{support.isolation} ({support.reason}), {user}"
