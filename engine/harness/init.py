"""The first process of every sandbox (run as a script by sandbox.py; never imported by the engine).

It is PID 1 of its own PID namespace, or a child subreaper in the fallback. It applies the resource limits
and the CPU affinity, joins the pids cgroup, makes the file system read-only except the private directory,
drops root privileges, starts the command, reaps every descendant, writes the command's exit status (and
rusage) to ``--status``, and kills whatever the command left behind before it exits. Standard library only:
it runs with ``python -I -S``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
EXIT_SETUP_FAILED = 70


def _prctl(option: int, value: int) -> None:
    libc = _libc()
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


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
            except ProcessLookupError:
                pass
        while True:
            try:
                reaped, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if reaped == 0:
                break
    return len(seen)


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
SECBITS_NOROOT_LOCKED = 0x01 | 0x02 | 0x40 | 0x80  # NOROOT, its lock, NO_CAP_AMBIENT_RAISE, its lock
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28


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


def _drop_capabilities() -> None:
    """Stay uid 0 but without any capability, now or after exec (no module loading, raw devices,
    ptrace of other users, mounting, or bypassing file permissions)."""
    libc = _libc()
    libc.prctl(PR_SET_SECUREBITS, SECBITS_NOROOT_LOCKED, 0, 0, 0)
    for capability in range(64):
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the last capability: ignored
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"capset: {os.strerror(error)}")


def init_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="init.py")
    parser.add_argument("--status", required=True, type=Path)
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
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    status: dict[str, Any] = {"setup_error": None, "exit_code": None, "signal": None, "leftover": 0}
    try:
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
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        if args.uid >= 0:
            os.setgroups([])
            os.setgid(args.gid)
            os.setuid(args.uid)
        elif args.drop_capabilities:
            _drop_capabilities()
        # A credential change clears the parent-death signal `unshare --kill-child` set: set it again, so
        # this init (and with it the whole PID namespace) dies with the sandbox's supervisor.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
    except OSError as error:
        status["setup_error"] = f"sandbox setup failed: {error}"
        _write_json_atomic(args.status, status)
        return EXIT_SETUP_FAILED
    me = os.getpid()

    def on_term(signum: int, frame: Any) -> None:
        _kill_descendants(me)
        status["signal"] = signal.SIGKILL
        status["terminated"] = True
        _write_json_atomic(args.status, status)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
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
    status["seconds"] = time.perf_counter() - started
    status["leftover"] = _kill_descendants(me)
    _write_json_atomic(args.status, status)
    return 0


if __name__ == "__main__":
    sys.exit(init_main(sys.argv[1:]))
