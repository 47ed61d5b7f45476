"""The first process of every sandbox (run as a script by sandbox.py; never imported by the engine).

It is PID 1 of its own PID namespace, or a child subreaper in the fallback. It applies the resource limits
and the CPU affinity, joins the pids cgroup, makes the file system read-only except the private directory,
lowers its privileges (engine/harness/privileges.py: become ``--uid``, or stay uid 0 with no capability, or,
for ``--late-drop``, with only the two the command needs to become another user itself), starts the command
with nothing open but standard input, output, error and ``--pass-fds``, reaps every descendant, and kills
whatever the command left behind before it exits. The command's exit status (and rusage) goes to the
supervisor as one JSON line on ``--status-fd``, a pipe: never through a file in the private directory, which
the command may have filled with links. Standard library only: it runs with ``python -I -S``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
EXIT_SETUP_FAILED = 70


def _load_privileges() -> Any:
    """engine/harness/privileges.py, beside this file (``-S``: the engine package is not importable)."""
    spec = importlib.util.spec_from_file_location("kf_privileges", Path(__file__).with_name("privileges.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _kill_descendants(me: int) -> int:
    """SIGKILL every descendant. Orphans are re-parented to us (PID 1 or subreaper), so repeat until none.

    Returns how many processes were found alive."""
    seen: set[int] = set()
    quiet_rounds = 0
    for _ in range(500):
        children = _children(me)
        if not children:
            quiet_rounds += 1
            if quiet_rounds >= 3:
                break
            time.sleep(0.002)
        else:
            quiet_rounds = 0
        for child in children:
            seen.add(child)
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass  # gone already
        while True:
            try:
                reaped, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if reaped == 0:
                break
    return len(seen)


def _report(fd: int, status: dict[str, Any]) -> None:
    """Send the status to the supervisor: one JSON line on the status pipe (it reads the last whole one)."""
    data = (json.dumps(status) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor not in ``keep``: the command inherits exactly those."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = max(low, fd + 1)
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, flags: int) -> None:
    encoded = source.encode() if source else None
    if _libc().mount(encoded, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {target}: {os.strerror(error)}")


def _read_only_filesystem(writable: Path) -> None:
    """In the sandbox's private mount namespace: every mount read-only except the private directory.

    Only ever called inside ``unshare --mount``: the remounts change this namespace's view, not the host's.
    A candidate (even one running as uid 0) can then write nothing but its own scratch directory."""
    _mount(None, "/", MS_REC | MS_PRIVATE)  # never propagate anything to the host
    _mount(str(writable), str(writable), MS_BIND)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        target = fields[4].encode().decode("unicode_escape")
        if Path(target) == writable:
            continue
        options = set(fields[5].split(","))
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        flags |= MS_NOSUID if "nosuid" in options else 0
        flags |= MS_NODEV if "nodev" in options else 0
        flags |= MS_NOEXEC if "noexec" in options else 0
        try:
            _mount(None, target, flags)
        except OSError:
            pass  # a mount hidden under another one, or one the kernel refuses to remount: best effort


def init_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="init.py")
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--as-bytes", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--fsize-bytes", type=int, required=True)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--cpus", default="")
    parser.add_argument("--uid", type=int, default=-1)
    parser.add_argument("--gid", type=int, default=-1)
    parser.add_argument("--cgroup-procs", default="")
    parser.add_argument("--read-only-except", default="")
    parser.add_argument("--drop-capabilities", action="store_true")
    parser.add_argument("--late-drop", action="store_true")
    parser.add_argument("--pass-fds", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    status_fd: int = args.status_fd
    os.set_inheritable(status_fd, False)
    pass_fds = {int(fd) for fd in args.pass_fds.split(",") if fd}
    parent = os.getppid()  # the supervisor (fallback), or 0: unshare, outside this PID namespace
    status: dict[str, Any] = {"setup_error": None, "exit_code": None, "signal": None, "leftover": 0}
    try:
        privileges = _load_privileges()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_AS, (args.as_bytes, args.as_bytes))
        # Soft limit: SIGXCPU (reported as timeout); the hard limit a few seconds later is SIGKILL.
        resource.setrlimit(resource.RLIMIT_CPU, (args.cpu_seconds, args.cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_bytes, args.fsize_bytes))
        if args.nproc > 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (args.nproc, args.nproc))
        if args.cpus:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        if args.cgroup_procs:
            # Joining a pids cgroup bounds processes and threads even for uid 0 (RLIMIT_NPROC never does).
            Path(args.cgroup_procs).write_text("0")
        if args.read_only_except:
            _read_only_filesystem(Path(args.read_only_except))
            os.chdir(args.read_only_except)  # the old working directory is the read-only one underneath
        privileges.prctl(PR_SET_CHILD_SUBREAPER, 1)
        if args.uid >= 0:
            os.setgroups([])
            os.setgid(args.gid)
            os.setuid(args.uid)
        elif args.late_drop:
            privileges.keep_only_setid_capabilities()
        elif args.drop_capabilities:
            privileges.drop_all_capabilities()
        # A credential change clears the parent-death signal (set by `unshare --kill-child`, or by the
        # supervisor in the fallback): set it again, so this init -- and with it the whole PID namespace --
        # dies with the sandbox's supervisor. If the parent is already gone, the signal never comes: leave.
        privileges.prctl(privileges.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            raise OSError(0, "the sandbox's supervisor died during set-up")
        privileges.prctl(privileges.PR_SET_NO_NEW_PRIVS, 1)
        for fd in pass_fds:
            os.set_inheritable(fd, True)
    except OSError as error:
        status["setup_error"] = f"sandbox setup failed: {error}"
        _report(status_fd, status)
        return EXIT_SETUP_FAILED
    me = os.getpid()

    def on_term(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _kill_descendants(me)
        status["signal"] = signal.SIGKILL
        status["terminated"] = True
        _report(status_fd, status)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            # In the fallback no namespace takes the command down with this init: its own parent-death
            # signal does (a change of uid clears it; privileges.drop_privileges sets it again).
            privileges.prctl(privileges.PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:
                os._exit(127)
            _close_all_but({0, 1, 2, *pass_fds})
            os.execv(command[0], command)
        except OSError as error:
            os.write(2, f"cannot start {command[0]}: {error}\n".encode())
        os._exit(127)
    while True:
        try:
            reaped, wait_status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if reaped == pid:
            if os.WIFSIGNALED(wait_status):
                status["signal"] = os.WTERMSIG(wait_status)
            else:
                status["exit_code"] = os.WEXITSTATUS(wait_status)
            status["max_rss_kb"] = usage.ru_maxrss
            status["cpu_seconds"] = usage.ru_utime + usage.ru_stime
            break
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finishing anyway: one status line, not two
    status["seconds"] = time.perf_counter() - started
    status["leftover"] = _kill_descendants(me)
    _report(status_fd, status)
    return 0


if __name__ == "__main__":
    sys.exit(init_main(sys.argv[1:]))
