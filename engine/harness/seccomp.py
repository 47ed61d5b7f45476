"""Which system calls the sandboxed worker may still make once a candidate's code can run.

A candidate can issue any system call with one inline ``syscall`` instruction, so no check of the symbols it
imports stops it from opening a file, starting a process or talking to the network. The kernel can: a
seccomp filter, installed by the worker before the candidate's library is loaded, judges every system call
the process makes from then on. Filters stack -- each one only restricts further -- and the worker installs
two, in this order:

``confine("load", threads=n)``, just before ``dlopen`` of the candidate's library
    The dynamic loader must still read the library and map its code, so this stage adds to the common set:
    ``openat``/``open`` when the flags are read-only (no ``O_WRONLY``/``O_RDWR``, ``O_CREAT``, ``O_TRUNC``,
    ``O_APPEND``, ``O_TMPFILE``), ``mmap``/``mprotect`` with any protection (code is mapped ``PROT_EXEC``),
    ``ioctl(fd, TCGETS)`` only (Python's ``open()`` asks whether a file is a terminal; a lazy import opens
    files that way), and the two calls that install the run stage on top: ``prctl(PR_SET_NO_NEW_PRIVS)``
    and ``seccomp(SECCOMP_SET_MODE_FILTER)`` (both can only take rights away). No candidate code runs during
    the load: a static screen forbids constructors and load-time resolvers.

``confine("run", threads=n)``, after loading and before the first candidate call
    Only the common set: the process can read and write the descriptors it already has, use memory,
    futexes and clocks, and exit. Nothing is opened any more (no ``open``/``openat``), and ``mmap``/
    ``mprotect`` are refused when ``PROT_EXEC`` is asked for: no JIT, no making data executable. Since
    filters stack, everything the load stage allowed beyond this set is refused from here on.

The common set (both stages):

- descriptors already open: ``read``, ``write``, ``readv``, ``writev``, ``pread64``, ``pwrite64``, ``lseek``,
  ``close``, ``fstat``, ``newfstatat`` (glibc's ``fstat()`` *is* ``newfstatat(fd, "", AT_EMPTY_PATH)``; a
  filter cannot see the path, so a path can be stat-ed too -- metadata, never contents), ``getdents64``
  (``os.listdir`` of a directory descriptor opened before the filter), ``fcntl`` with ``F_GETFD``,
  ``F_SETFD``, ``F_GETFL``, ``F_SETFL`` or ``F_DUPFD_CLOEXEC`` only (``os.listdir(fd)`` duplicates the
  descriptor, ``os.set_blocking`` sets flags);
- memory: ``mmap``, ``munmap``, ``mremap``, ``brk``, ``madvise``, ``mprotect`` (without ``PROT_EXEC`` in the
  run stage), and ``mbind(addr, len, MPOL_PREFERRED, NULL, ...)`` only: numpy's OpenBLAS asks for
  node-local pages for each buffer it maps, in the middle of a matrix product;
- threads and time: ``futex``, ``clock_gettime``, ``clock_getres``, ``gettimeofday``, ``clock_nanosleep``,
  ``nanosleep``, ``sched_yield``, ``sched_getaffinity``, ``poll``, ``ppoll``, ``select``, ``pselect6`` (a
  blocking read of a pipe may wait with them), ``set_robust_list``, ``rseq``;
- identity: ``getpid``, ``gettid``, ``getppid``, ``getuid``, ``geteuid``, ``getgid``, ``getegid``,
  ``getrandom``;
- signals and exit: ``rt_sigreturn``, ``rt_sigprocmask``, ``sigaltstack``, ``restart_syscall``, ``exit``,
  ``exit_group``; ``tgkill``/``tkill`` only aimed at this process and only with a crash's signal (SEGV, BUS, ILL,
  FPE, ABRT, TRAP, SYS: ``raise()``; the fatal-signal reporter
  re-raises the signal it caught); ``rt_sigaction`` setting a handler only for a crash's signals but ``SIGSYS``
  (the reporter's must stay in place) and ``SIGINT`` (the interpreter restores its handler when it exits), and
  reading any other's (a handler for ``SIGCONT``, which resumes the worker, ran candidate code outside its calls);
- with ``threads > 1``: ``clone`` when its flags contain ``CLONE_THREAD`` (OpenMP's worker threads; a fork
  is refused). ``clone3`` always fails with ``ENOSYS`` -- its flags sit in a struct the filter cannot read
  -- and glibc then falls back to ``clone``, whose flags it can. With ``threads == 1`` there is no ``clone``.

Everything else -- ``socket``, ``connect``, ``fork``/``vfork``/``execve``, ``kill``, ``ptrace``,
``process_vm_*``, ``setsid``, ``sched_setaffinity``, ``prctl`` (in the run stage), ``ioctl``, ``mount``,
``unshare``, ``bpf``, ``perf_event_open``, ``personality``, ``statx``, ``openat2``, ``memfd_create``... --
is answered with ``SCMP_ACT_TRAP``: the kernel sends ``SIGSYS`` with the call's number in ``si_syscall``,
the fatal-signal reporter (``fatal_shim.c``) writes it to the fatal pipe, and the worker dies from
``SIGSYS``. So does a call made through another ABI (x32 numbers, ``int 0x80``). ``syscall_name`` turns
the number into a name for the verdict. One refusal comes without a number: ``pthread_create`` blocks every
signal around ``clone``, and the kernel delivers a blocked ``SIGSYS`` with its default action, so a thread
started when ``threads == 1`` kills the process from ``SIGSYS`` before the reporter can run.

What this means for the worker after ``confine("run")``: no imports (even a lazy one inside numpy opens a
file), no file opened by path (``np.load``, ``Path.read_text``, ``os.listdir("/proc/...")``; a directory
descriptor opened before can still be listed), no new descriptor but a duplicate (``os.dup`` works, it is
``fcntl(F_DUPFD_CLOEXEC)``; ``os.pipe`` and ``os.dup2`` do not), no ``getrusage``, ``prlimit64``, ``uname``
or ``sysinfo``, no new process, and no waiting on anything but futexes, clocks and descriptors it already
holds. Reading and writing its pipes (``os.read``, ``os.readv``,
``os.write``, ``select.select``), pydantic models, numpy (BLAS threads included), ``time.perf_counter_ns``,
``time.sleep``, ``gc`` and ``os._exit`` all keep working, and so does a normal interpreter exit.

The module is imported by the sandboxed child, so it needs only the standard library and pyseccomp (a
ctypes wrapper of the system's ``libseccomp.so.2``). When either is missing, ``confine`` raises
``SeccompUnavailable`` -- the harness's fault, never the candidate's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import signal
import sys
import termios
from types import ModuleType
from typing import Any, Literal

__all__ = ["SeccompUnavailable", "confine", "fence_off_other_processes", "syscall_name"]

Stage = Literal["load", "run"]


class SeccompUnavailable(RuntimeError):
    """The filter cannot be installed on this machine (pyseccomp, libseccomp or kernel support is missing)."""


# Shared libraries pyseccomp opens, by their usual soname. pyseccomp looks them up with
# ctypes.util.find_library, which runs `ldconfig -p` in a subprocess: in the sandbox that costs two process
# starts against the pids limit, and ldconfig may be missing from the sandbox's view of the file system.
_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}
_real_find_library = ctypes.util.find_library


def _find_library_without_subprocess(name: str) -> str | None:
    soname = _SONAMES.get(name)
    if soname is not None:
        try:
            ctypes.CDLL(soname)
            return soname
        except OSError:
            pass
    return _real_find_library(name)


def _import_pyseccomp() -> tuple[ModuleType | None, str]:
    """pyseccomp, or None and why not. Imported when this module is: the worker imports it before it drops
    privileges and installs the filter, when the package's files can still be opened."""
    ctypes.util.find_library = _find_library_without_subprocess
    try:
        import pyseccomp
    except ImportError as error:
        return None, (
            f"the Python package pyseccomp is not installed for {sys.executable} ({error}); "
            "install it with: pip install 'pyseccomp>=0.1.2'"
        )
    except (RuntimeError, OSError) as error:
        return None, (
            f"pyseccomp could not load the system library libseccomp.so.2 ({error}); install it "
            "(Debian/Ubuntu: apt-get install libseccomp2; Fedora/RHEL: dnf install libseccomp)"
        )
    finally:
        ctypes.util.find_library = _real_find_library
    return pyseccomp, ""


_pyseccomp, _missing = _import_pyseccomp()

# Flag bits that make an open more than a read. O_TMPFILE includes O_DIRECTORY, which a read-only listing
# uses, so only its own bit is refused.
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | (os.O_TMPFILE & ~os.O_DIRECTORY)
_CLONE_THREAD = 0x00010000  # <linux/sched.h>; os.CLONE_THREAD only exists from Python 3.12
_PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>
_SECCOMP_SET_MODE_FILTER = 1  # <linux/seccomp.h>
_MPOL_PREFERRED = 1  # <linux/mempolicy.h>
_MAX_SIGNAL = 64
# An int argument travels in a 64-bit register, and the kernel reads only its lower half: a rule that
# allows a value of such an argument compares that half, exactly what the kernel will act on.
_INT = 0xFFFFFFFF

_ALWAYS = (
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "lseek",
    "close",
    "fstat",
    "newfstatat",
    "getdents64",
    "munmap",
    "mremap",
    "brk",
    "madvise",
    "futex",
    "clock_gettime",
    "clock_getres",
    "gettimeofday",
    "clock_nanosleep",
    "nanosleep",
    "sched_yield",
    "sched_getaffinity",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "set_robust_list",
    "rseq",
    "getpid",
    "gettid",
    "getppid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getrandom",
    "rt_sigreturn",
    "rt_sigprocmask",
    "sigaltstack",
    "restart_syscall",
    "exit",
    "exit_group",
)
# Checked first: what OpenMP barriers and the harness's pipes call while a candidate is being timed (the
# filter otherwise tests system calls one after another).
_HOT = ("futex", "sched_yield", "read", "write")
_FCNTL_COMMANDS = (fcntl.F_GETFD, fcntl.F_SETFD, fcntl.F_GETFL, fcntl.F_SETFL, fcntl.F_DUPFD_CLOEXEC)


def confine(stage: Stage, *, threads: int) -> None:
    """Install the filter of ``stage`` on every thread of this process; see the module docstring.

    Call ``confine("load", ...)`` right before loading candidate libraries and ``confine("run", ...)`` right
    before the first candidate call; ``threads`` is how many threads the candidate may run at once (1: it may
    start none). After ``"run"`` no further filter can be installed.
    """
    if stage not in ("load", "run"):
        raise ValueError(f"unknown seccomp stage {stage!r}: use 'load' or 'run'")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if _pyseccomp is None:
        raise SeccompUnavailable(_missing)
    ps = _pyseccomp
    rules = _Rules(ps, ps.SyscallFilter(ps.TRAP))
    for name in _ALWAYS:
        rules.allow(name)
    _allow_signals(rules, os.getpid())
    for command in _FCNTL_COMMANDS:
        rules.allow("fcntl", ps.Arg(1, ps.MASKED_EQ, _INT, command))
    # OpenBLAS (numpy's BLAS) asks for node-local pages for each buffer it maps: mbind(addr, length,
    # MPOL_PREFERRED, NULL, 0, 0). Only that form: it moves nothing and names no node.
    rules.allow("mbind", ps.Arg(2, ps.MASKED_EQ, _INT, _MPOL_PREFERRED), ps.Arg(3, ps.EQ, 0))
    if threads > 1:
        rules.allow("clone", ps.Arg(0, ps.MASKED_EQ, _CLONE_THREAD, _CLONE_THREAD))
    rules.add(ps.ERRNO(errno.ENOSYS), "clone3")
    if stage == "load":
        _allow_loading(rules)
    else:
        # mmap(addr, length, prot, ...) and mprotect(addr, length, prot): prot is argument 2 of both.
        for name in ("mmap", "mprotect"):
            rules.allow(name, ps.Arg(2, ps.MASKED_EQ, mmap.PROT_EXEC, 0))
    rules.install()


_SELF_SIGNALS: tuple[int, ...] = tuple(
    int(s)
    for s in (
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGILL,
        signal.SIGFPE,
        signal.SIGABRT,
        signal.SIGTRAP,
        signal.SIGSYS,
    )
)
"""What a sandboxed kernel may send itself: the signals of a crash, which ``crash`` verdicts are made of."""
_HANDLED: frozenset[int] = frozenset({*_SELF_SIGNALS, int(signal.SIGINT)} - {int(signal.SIGSYS)})
"""The signals whose handler may be set under the filter (see _allow_signals)."""


def _allow_signals(rules: _Rules, pid: int) -> None:
    ps = rules.ps
    # raise() is tgkill(getpid(), gettid(), sig); tkill's only argument is a thread id, so it may only aim at
    # the main thread, whose id is the process's. Only the signals a crash raises (and the fatal-signal
    # reporter re-raises) may be sent: a kernel that could SIGKILL or SIGTERM itself would look like a harness
    # killed from outside, which is re-run and never the kernel's verdict, so it could dodge judgement.
    for sent in _SELF_SIGNALS:
        rules.allow("tgkill", ps.Arg(0, ps.MASKED_EQ, _INT, pid), ps.Arg(2, ps.EQ, sent))
        rules.allow("tkill", ps.Arg(0, ps.MASKED_EQ, _INT, pid), ps.Arg(1, ps.EQ, sent))
    # A handler for a crash's signals (which only the kernel's own faults raise, while it runs) and SIGINT (the
    # interpreter restores its own when it exits); any other signal's action may only be read (a NULL new
    # action). A handler for SIGCONT, which the parent sends to resume the worker before each command, ran the
    # kernel's code outside any timed call, e.g. to put right the outputs of calls it skipped before a fetch.
    # One signal at a time: each comparison takes the whole register, so a value with its upper half set
    # (which the kernel would truncate to SIGSYS) matches none of them. SIGSYS's reporter must stay in place.
    for number in range(1, _MAX_SIGNAL + 1):
        if number in _HANDLED:
            rules.allow("rt_sigaction", ps.Arg(0, ps.EQ, number))
        elif number != signal.SIGSYS:
            rules.allow("rt_sigaction", ps.Arg(0, ps.EQ, number), ps.Arg(1, ps.EQ, 0))


def _allow_loading(rules: _Rules) -> None:
    ps = rules.ps
    rules.allow("openat", ps.Arg(2, ps.MASKED_EQ, _WRITE_FLAGS, 0))
    rules.allow("open", ps.Arg(1, ps.MASKED_EQ, _WRITE_FLAGS, 0))
    rules.allow("mmap")
    rules.allow("mprotect")
    rules.allow("ioctl", ps.Arg(1, ps.MASKED_EQ, _INT, termios.TCGETS))
    # What libseccomp calls to install the run stage on top of this one. Both only ever take rights away.
    rules.allow("prctl", ps.Arg(0, ps.MASKED_EQ, _INT, _PR_SET_NO_NEW_PRIVS))
    rules.allow("seccomp", ps.Arg(0, ps.MASKED_EQ, _INT, _SECCOMP_SET_MODE_FILTER))


class _Rules:
    """A filter being built: rules by system-call name, then installed on all threads."""

    def __init__(self, ps: ModuleType, syscall_filter: Any) -> None:
        self.ps = ps
        self.filter = syscall_filter

    def allow(self, name: str, *conditions: Any) -> None:
        self.add(self.ps.ALLOW, name, *conditions)

    def add(self, action: int, name: str, *conditions: Any) -> None:
        number = self.ps.resolve_syscall(self.ps.Arch.NATIVE, name)
        if number == -1:
            raise ValueError(f"libseccomp knows no system call named {name!r}")
        if number < 0:
            return  # a call this architecture does not have (open, poll and select on arm64): nothing to allow
        self.filter.add_rule(action, number, *conditions)

    def install(self) -> None:
        ps = self.ps
        for name in _HOT:
            self.filter.syscall_priority(name, 255)
        # A call through another ABI (int 0x80, x32 numbers) is refused the same way, with a report.
        self.filter.set_attr(ps.Attr.ACT_BADARCH, ps.TRAP)
        # Without no_new_privs an unprivileged process may not install a filter; it also keeps setuid
        # binaries from gaining anything (there is no execve left anyway).
        self.filter.set_attr(ps.Attr.CTL_NNP, 1)
        # Every thread, not only the caller: numpy's BLAS threads already exist when the filter goes in, and
        # candidate code could hand them work.
        self.filter.set_attr(ps.Attr.CTL_TSYNC, 1)
        try:
            self.filter.load()
        except OSError as error:
            raise SeccompUnavailable(
                f"the kernel refused the seccomp filter ({error}); it needs Linux >= 3.17 with "
                "CONFIG_SECCOMP_FILTER, and a container runtime whose own profile allows seccomp() and prctl()"
            ) from error


def fence_off_other_processes() -> None:
    """A filter for a process that runs a user's problem.py (engine/problem_host.py): every system call works,
    but a signal may go only to this process, and ptrace, process_vm_readv/writev, pidfd_send_signal, setsid and
    setpgid fail with EPERM.

    problem.py runs as the user of the ``kf`` command that loaded it, which it could otherwise kill (it did:
    ``os.kill(os.getppid(), SIGKILL)`` ended ``kf evaluate`` with no word), write into, or outlive by moving a
    process of its own out of the group the judge kills when it stops the host. Refused, the call raises
    (PermissionError) in problem.py, which reports it as the problem's error like any other."""
    if _pyseccomp is None:
        raise SeccompUnavailable(_missing)
    ps = _pyseccomp
    rules = _Rules(ps, ps.SyscallFilter(ps.ALLOW))
    refuse = ps.ERRNO(errno.EPERM)
    pid = os.getpid()
    # Signals to this process only: another process, a group (a pid of 0 or below) or any value with upper bits
    # set in the register (which the kernel would truncate) is refused. libseccomp takes one comparison per
    # argument in a rule, so a signal to its own group cannot be allowed as well: nothing needs one.
    rules.add(refuse, "kill", ps.Arg(0, ps.NE, pid))
    rules.add(refuse, "tgkill", ps.Arg(0, ps.NE, pid))
    rules.add(refuse, "rt_sigqueueinfo", ps.Arg(0, ps.NE, pid))
    rules.add(refuse, "rt_tgsigqueueinfo", ps.Arg(0, ps.NE, pid))
    rules.add(refuse, "tkill", ps.Arg(0, ps.NE, pid))
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_send_signal", "setsid", "setpgid"):
        rules.add(refuse, name)
    rules.install()


def syscall_name(number: int, *, arch: int | None = None) -> str:
    """The name of system call ``number`` on this machine's architecture (or on the AUDIT_ARCH value ``arch``
    that the fatal-signal reporter saw), e.g. 257 -> "openat" on x86-64; "unknown" when libseccomp has no
    name for it or cannot be loaded."""
    if _pyseccomp is None:
        return "unknown"
    try:
        name = _pyseccomp.resolve_syscall(_pyseccomp.Arch.NATIVE if arch is None else arch, number)
    except ValueError:
        return "unknown"
    return str(name.decode())
