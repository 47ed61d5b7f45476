"""The seccomp filter of the sandboxed worker (engine/harness/seccomp.py), in real processes.

Each test runs a small Python program with ``python -I``, as the worker runs: it installs the fatal-signal
reporter (engine/harness/fatal_shim.c, compiled here) on a pipe, imports numpy, confines itself to the
"load" stage, loads libraries compiled by the test, confines itself to the "run" stage and then does one
thing. Allowed work must keep working; a forbidden system call -- made through libc or with a raw
``syscall`` instruction -- must kill the process with SIGSYS and be reported by number, which
``syscall_name`` must name. Skipped only where the kernel or libseccomp cannot install a filter.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.hardware import c_compiler
from engine.harness.cpu import harness_shim
from engine.harness.seccomp import confine, syscall_name

X86_64 = platform.machine() == "x86_64"

MATH_C = """
double kf_axpy(double a, double x, double y) { return a * x + y; }
"""

OMP_C = """
#include <omp.h>
/* Fills x[i] = i / 2 in parallel; returns how many threads the team had. */
int kf_fill(double *x, long n) {
    int team = 0;
#pragma omp parallel
    {
#pragma omp single
        team = omp_get_num_threads();
#pragma omp for
        for (long i = 0; i < n; i++) x[i] = i * 0.5;
    }
    return team;
}
"""

# What a hostile kernel might try. Each raw_* function issues the system call with an inline instruction,
# so no symbol check would see it; each libc_* function goes through glibc. A child that a fork left behind
# (were the filter broken) leaves at once instead of running the test's Python.
ESCAPES_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

static long raw(long n, long a, long b, long c, long d, long e) {
    long ret;
#if defined(__x86_64__)
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    ret = x0;
#else
#error "raw system calls are written for x86-64 and arm64"
#endif
    return ret;
}

static long leave_if_child(long pid) {
    if (pid == 0) raw(SYS_exit_group, 0, 0, 0, 0, 0);
    return pid;
}

long raw_openat(void) { return raw(SYS_openat, AT_FDCWD, (long)"/etc/hostname", O_RDONLY, 0, 0); }
long raw_socket(void) { return raw(SYS_socket, AF_INET, SOCK_STREAM, 0, 0, 0); }
long raw_clone_process(void) { return leave_if_child(raw(SYS_clone, SIGCHLD, 0, 0, 0, 0)); }
long raw_kill_parent(void) { return raw(SYS_kill, getppid(), 0, 0, 0, 0); }
long raw_tgkill_parent(void) { return raw(SYS_tgkill, getppid(), getppid(), 0, 0, 0); }
/* SIGSYS with the upper half of the register set: the kernel reads an int, the filter the whole register. */
long raw_sigaction_sigsys(void) { return raw(SYS_rt_sigaction, (1L << 32) | SIGSYS, 0, 0, 8, 0); }
long raw_ioctl(void) { struct termios t; return raw(SYS_ioctl, 0, TCGETS, (long)&t, 0, 0); }
#ifdef SYS_fork
long raw_fork(void) { return leave_if_child(raw(SYS_fork, 0, 0, 0, 0, 0)); }
#endif
#if defined(__x86_64__)
/* The same openat through the x32 ABI (number | 0x40000000). */
long raw_x32_openat(void) { return raw(SYS_openat | 0x40000000L, AT_FDCWD, (long)"/etc/hostname", O_RDONLY, 0, 0); }
#endif

long libc_open(void) { return open("/etc/hostname", O_RDONLY); }
long libc_socket(void) { return socket(AF_INET, SOCK_STREAM, 0); }
long libc_fork(void) { return leave_if_child(fork()); }
long libc_execve(void) {
    char *argv[] = {"/bin/true", 0};
    return execve("/bin/true", argv, 0);
}
long libc_ignore_sigsys(void) { return (long)signal(SIGSYS, SIG_IGN); }
/* A handler for SIGCONT, which the parent sends before every command: code of the kernel's outside its calls. */
static void on_resume(int signum) { (void)signum; }
long libc_handle_sigcont(void) { return (long)signal(SIGCONT, on_resume); }
/* Reading an action (no new one) stays allowed, and so does a handler for a crash's signal. */
long libc_read_sigcont_and_handle_sigtrap(void) {
    struct sigaction now;
    if (sigaction(SIGCONT, 0, &now) != 0) return -1;
    return signal(SIGTRAP, on_resume) == SIG_ERR ? -2 : 1;
}
long libc_prctl(void) { return prctl(PR_SET_NAME, "escaped", 0, 0, 0); }
long libc_setaffinity(void) {
    cpu_set_t all;
    CPU_ZERO(&all);
    CPU_SET(0, &all);
    return sched_setaffinity(0, sizeof all, &all);
}

long mprotect_exec(void) {
    void *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return -1;
    return mprotect(page, 4096, PROT_READ | PROT_EXEC);
}
long mmap_exec(void) {
    return (long)mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}
long segfault(void) { return *(volatile long *)8; }
"""

# The start of every program: what the worker does before it confines itself. The libraries a kernel may
# link against are loaded before the filter, as the worker loads them.
PRELUDE = """
import ctypes, os, sys, time
import numpy
from engine.harness.seccomp import confine
fatal_fd, libs, threads = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ctypes.CDLL(os.path.join(libs, "shim.so")).kf_install_fatal_handlers(fatal_fd)
for name in ("libm.so.6", "libgomp.so.1"):
    ctypes.CDLL(name)
"""

# The usual path to a candidate call: load stage, the libraries, run stage.
CONFINED = """
confine("load", threads=threads)
math = ctypes.CDLL(os.path.join(libs, "math.so"), mode=os.RTLD_NOW | os.RTLD_LOCAL)
omp = ctypes.CDLL(os.path.join(libs, "omp.so"), mode=os.RTLD_NOW | os.RTLD_LOCAL)
escapes = ctypes.CDLL(os.path.join(libs, "escapes.so"), mode=os.RTLD_NOW | os.RTLD_LOCAL)
math.kf_axpy.restype = ctypes.c_double
math.kf_axpy.argtypes = [ctypes.c_double] * 3
omp.kf_fill.argtypes = [ctypes.c_void_p, ctypes.c_long]
confine("run", threads=threads)
"""


@dataclass
class Outcome:
    """How one confined program ended."""

    returncode: int
    """The exit status; -N when signal N killed it."""
    stdout: str
    """What it printed."""
    stderr: str
    """Its error output (a traceback, if Python raised)."""
    fatal: dict[str, Any] | None
    """The fatal-signal reporter's line, if it wrote one."""


@dataclass
class Confined:
    """Runs programs under the filter, with the test's libraries compiled into ``libs``."""

    libs: Path

    def run(
        self,
        body: str,
        *,
        stages: bool = True,
        before: str = "",
        threads: int = 1,
        omp_threads: int = 0,
        pass_fds: tuple[int, ...] = (),
    ) -> Outcome:
        """Run ``body`` after the prelude, ``before`` and (with ``stages``) both stages and the loads."""
        fatal_r, fatal_w = os.pipe()
        script = PRELUDE + textwrap.dedent(before) + (CONFINED if stages else "") + textwrap.dedent(body)
        env = dict(os.environ, OMP_NUM_THREADS=str(omp_threads or threads))
        try:
            run = subprocess.run(
                [sys.executable, "-I", "-c", script, str(fatal_w), str(self.libs), str(threads)],
                pass_fds=(fatal_w, *pass_fds),
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                check=False,
            )
            os.close(fatal_w)
            fatal_w = -1
            with os.fdopen(fatal_r, "rb") as reader:
                fatal_r = -1
                lines = reader.read().decode().splitlines()
        finally:
            for fd in (fatal_r, fatal_w):
                if fd >= 0:
                    os.close(fd)
        return Outcome(run.returncode, run.stdout, run.stderr, json.loads(lines[0]) if lines else None)


def _compile(source: str, library: Path, *flags: str) -> None:
    c_file = library.with_suffix(".c")
    c_file.write_text(source)
    subprocess.run(
        [c_compiler(), "-O2", "-shared", "-fPIC", *flags, "-o", str(library), str(c_file)],
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> Confined:
    libs = tmp_path_factory.mktemp("seccomp-libs")
    shim = harness_shim(libs / "cache")
    assert shim is not None, "engine/harness/fatal_shim.c did not compile"
    (libs / "shim.so").write_bytes(shim.read_bytes())
    _compile(MATH_C, libs / "math.so")
    _compile(OMP_C, libs / "omp.so", "-fopenmp")
    _compile(ESCAPES_C, libs / "escapes.so")
    runner = Confined(libs)
    probe = runner.run('confine("run", threads=1)\nprint("confined")', stages=False)
    if "SeccompUnavailable" in probe.stderr:
        pytest.skip(f"seccomp filters cannot be installed here: {probe.stderr.strip().splitlines()[-1]}")
    assert probe.returncode == 0 and probe.stdout == "confined\n", probe.stderr
    return runner


def _assert_refused(outcome: Outcome, name: str) -> None:
    assert outcome.returncode == -signal.SIGSYS, (outcome.returncode, outcome.stdout, outcome.stderr)
    assert outcome.fatal is not None, "the fatal-signal reporter wrote nothing"
    assert outcome.fatal["signal"] == signal.SIGSYS
    assert syscall_name(outcome.fatal["syscall"]) == name, outcome.fatal


# -- what keeps working -------------------------------------------------------------------------------------


def test_allowed_work_keeps_working_under_run(confined: Confined) -> None:
    inbox_r, inbox_w = os.pipe()
    outbox_r, outbox_w = os.pipe()
    os.write(inbox_w, b"from the test")
    os.close(inbox_w)
    body = f"""
    started = time.perf_counter_ns()
    big = numpy.arange(20_000_000, dtype=numpy.float64)  # 160 MB: fresh mmap-ed memory
    total = float((big * 2.0 + 1.0).sum())
    product = float((numpy.ones((300, 300)) @ numpy.ones((300, 300)))[0, 0])  # BLAS and its threads
    del big
    time.sleep(0.001)
    message = os.read({inbox_r}, 100)
    os.write({outbox_w}, message.upper())
    tasks = len(os.listdir(task_dir))  # a directory opened before the filter can still be listed
    elapsed = time.perf_counter_ns() - started
    signals = escapes.libc_read_sigcont_and_handle_sigtrap()
    print(total, product, math.kf_axpy(2.0, 3.0, 1.0), tasks >= 1, elapsed > 0, signals)
    """
    try:
        before = 'task_dir = os.open("/proc/self/task", os.O_RDONLY | os.O_DIRECTORY)\n'
        outcome = confined.run(body, before=before, pass_fds=(inbox_r, outbox_w))
        os.close(outbox_w)
        echoed = os.read(outbox_r, 100)
    finally:
        for fd in (inbox_r, outbox_r):
            os.close(fd)
    assert outcome.returncode == 0, outcome.stderr
    n = 20_000_000
    assert outcome.stdout.split() == [str(float(n * (n - 1) + n)), "300.0", "7.0", "True", "True", "1"]
    assert echoed == b"FROM THE TEST"
    assert outcome.fatal is None


def test_openmp_threads_work_when_threads_are_allowed(confined: Confined) -> None:
    body = """
    x = numpy.zeros(1_000_000)
    team = omp.kf_fill(x.ctypes.data, x.size)
    print(team, bool((x == numpy.arange(x.size) * 0.5).all()))
    """
    outcome = confined.run(body, threads=2)
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.split() == ["2", "True"]


def test_load_stage_opens_for_reading_only(confined: Confined, tmp_path: Path) -> None:
    readable = tmp_path / "readable.txt"
    readable.write_text("hello")
    created = tmp_path / "created.txt"
    body = f"""
    confine("load", threads=1)
    import fractions  # a lazy import reads files
    print(open({str(readable)!r}).read(), fractions.Fraction(1, 2), flush=True)
    os.open({str(created)!r}, os.O_WRONLY | os.O_CREAT, 0o600)
    print("created")
    """
    outcome = confined.run(body, stages=False)
    _assert_refused(outcome, "openat")
    assert outcome.stdout == "hello 1/2\n"
    assert not created.exists()


# -- what is refused ----------------------------------------------------------------------------------------


def test_run_stage_refuses_even_a_read_only_open(confined: Confined, tmp_path: Path) -> None:
    readable = tmp_path / "readable.txt"
    readable.write_text("hello")
    outcome = confined.run(f"os.open({str(readable)!r}, os.O_RDONLY)\nprint('opened')")
    _assert_refused(outcome, "openat")
    assert outcome.stdout == ""


ESCAPES = [
    pytest.param("raw_openat", 1, "openat", id="raw-openat"),
    pytest.param("raw_socket", 1, "socket", id="raw-socket"),
    pytest.param("raw_clone_process", 2, "clone", id="raw-clone-without-CLONE_THREAD"),
    pytest.param(
        "raw_fork", 2, "fork", id="raw-fork", marks=pytest.mark.skipif(not X86_64, reason="no fork system call")
    ),
    pytest.param("raw_kill_parent", 1, "kill", id="raw-kill-parent"),
    pytest.param("raw_tgkill_parent", 1, "tgkill", id="raw-tgkill-parent"),
    pytest.param("raw_sigaction_sigsys", 1, "rt_sigaction", id="raw-sigaction-SIGSYS-upper-bits"),
    pytest.param("raw_ioctl", 1, "ioctl", id="raw-ioctl-TCGETS"),
    pytest.param("libc_open", 1, "openat", id="libc-open"),
    pytest.param("libc_socket", 1, "socket", id="libc-socket"),
    pytest.param("libc_fork", 2, "clone", id="libc-fork"),
    pytest.param("libc_execve", 1, "execve", id="libc-execve"),
    pytest.param("libc_ignore_sigsys", 1, "rt_sigaction", id="libc-ignore-SIGSYS"),
    pytest.param("libc_handle_sigcont", 1, "rt_sigaction", id="libc-handle-SIGCONT"),
    pytest.param("libc_prctl", 1, "prctl", id="libc-prctl"),
    pytest.param("libc_setaffinity", 1, "sched_setaffinity", id="libc-sched_setaffinity"),
    pytest.param("mprotect_exec", 1, "mprotect", id="mprotect-PROT_EXEC"),
    pytest.param("mmap_exec", 1, "mmap", id="mmap-PROT_EXEC"),
]


@pytest.mark.parametrize(("function", "threads", "name"), ESCAPES)
def test_forbidden_system_calls_kill_with_sigsys(confined: Confined, function: str, threads: int, name: str) -> None:
    outcome = confined.run(f"print(escapes.{function}())", threads=threads)
    _assert_refused(outcome, name)
    assert outcome.stdout == ""


def test_one_thread_means_no_thread_creation(confined: Confined) -> None:
    body = """
    x = numpy.zeros(1000)
    print(omp.kf_fill(x.ctypes.data, x.size))
    """
    outcome = confined.run(body, threads=1, omp_threads=2)
    assert outcome.returncode == -signal.SIGSYS, outcome.stderr
    # pthread_create blocks every signal around clone, and the kernel delivers a blocked SIGSYS with its
    # default action: the process dies before the reporter can run, so there is no number to name.
    assert outcome.fatal is None or syscall_name(outcome.fatal["syscall"]) == "clone"


@pytest.mark.skipif(not X86_64, reason="the x32 ABI is x86-64's")
def test_another_abi_is_refused_too(confined: Confined) -> None:
    outcome = confined.run("print(escapes.raw_x32_openat())")
    assert outcome.returncode == -signal.SIGSYS, outcome.stderr
    assert outcome.fatal is not None and outcome.fatal["syscall"] == 257 | 0x40000000


def test_a_crash_under_the_filter_is_still_reported(confined: Confined) -> None:
    outcome = confined.run("print(escapes.segfault())")
    assert outcome.returncode == -signal.SIGSEGV, outcome.stderr
    assert outcome.fatal is not None
    assert outcome.fatal["signal"] == signal.SIGSEGV and outcome.fatal["address"] == "0x8"
    assert outcome.fatal["vm_peak_kb"] > 0 and "syscall" not in outcome.fatal


# -- the rest of the API ------------------------------------------------------------------------------------


@pytest.mark.skipif(not X86_64, reason="system call numbers are x86-64's")
def test_syscall_name_names_numbers_of_this_architecture() -> None:
    assert [syscall_name(n) for n in (0, 41, 57, 257)] == ["read", "socket", "fork", "openat"]
    assert syscall_name(5, arch=0x40000003) == "open"  # AUDIT_ARCH_I386
    assert syscall_name(100_000) == "unknown"


def test_unknown_stage_is_rejected_before_anything_is_installed() -> None:
    with pytest.raises(ValueError, match="unknown seccomp stage 'exec'"):
        confine("exec", threads=1)  # type: ignore[arg-type]


def test_missing_pyseccomp_is_reported_as_unavailable() -> None:
    script = """
import sys
sys.modules["pyseccomp"] = None  # as if it were not installed: importing it raises ImportError
from engine.harness.seccomp import SeccompUnavailable, confine
try:
    confine("run", threads=1)
except SeccompUnavailable as error:
    print(error)
"""
    run = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert "pyseccomp is not installed" in run.stdout and "pip install" in run.stdout
