"""A deadline the machine made a worker miss is not the kernel's timeout.

The machine is overloaded for real here: the worker is held by a CPU quota (a cgroup's), as in a container whose
co-tenants used the quota up, or it runs at SCHED_IDLE next to a process that keeps its CPU busy.
"""

from __future__ import annotations

import errno
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from engine.harness.cpu import DEFAULT_FLAGS, compile_source
from engine.harness.driver import Contender, Failed
from engine.harness.sandbox import CpuLease
from engine.harness.starvation import STARVED_PATIENCE, Watch, since
from engine.harness.validation import TrialRunner, plan_trials, validation_limits
from engine.harness.verdicts import Verdict
from engine.problems import load_problem

CALL_TIMEOUT_S = 1.0
SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"
NEVER_RETURNS = """
#include <stdint.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    volatile int64_t spin = 0;
    (void)x; (void)y; (void)rows; (void)cols;
    for (;;) spin++;
}
"""

# Sleeps and wakes only to spin around each deadline of its call (every SPINNER_TIMEOUT_S from the call's start,
# +-0.15 s): at every deadline the worker is runnable and had little CPU time, as a starved one. Before the parent
# looked while it waited, that was the machine's harness_error after 20 s, retried and never judged. Raw system
# calls (clock_gettime, clock_nanosleep: both allowed), so no symbol gives it away.
SPINNER_TIMEOUT_S = 4.0
DEADLINE_SPINNER = """
#include <stdint.h>
#include <time.h>
static long raw4(long n, long a, long b, long c, long d) {
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
static int64_t now_ns(void) {
    struct timespec t;
    raw4(228, CLOCK_MONOTONIC, (long)&t, 0, 0);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    int64_t start = now_ns();
    for (int64_t k = 1; k <= 16; k++) {
        int64_t wake = start + k * PERIOD_NS - 150000000LL;
        struct timespec until = {wake / 1000000000LL, wake % 1000000000LL};
        raw4(230, CLOCK_MONOTONIC, TIMER_ABSTIME, (long)&until, 0);
        while (now_ns() < start + k * PERIOD_NS + 150000000LL) { }
    }
}
""".replace("PERIOD_NS", f"{int(SPINNER_TIMEOUT_S * 1e9)}LL")


@contextmanager
def spinning_on(cpu: int) -> Iterator[subprocess.Popen[bytes]]:
    """A process that keeps ``cpu`` busy at normal priority."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)])
    try:
        time.sleep(0.3)  # started and pinned
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


def idle(pid: int) -> None:
    """Run ``pid`` only when its CPU has nothing else its session wants to run."""
    os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))


@contextmanager
def throttled(pid: int) -> Iterator[None]:
    """Hold ``pid`` to 1% of one CPU with a CPU quota, as a container whose quota its co-tenants used up: its
    threads stay ready to run (state R) and get no CPU."""
    # cgroup v1 only: there the cpu hierarchy is apart from the pids one the sandbox keeps the worker in (under
    # v2 moving the worker would take it out of that).
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.cfs_quota_us").is_file() or not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup v1 cpu hierarchy to hold the worker off its CPU with")
    group = root / f"kf-test-throttled-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("1000")
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        release(root, group)


def release(root: Path, group: Path) -> None:
    """Move what is left in ``group`` back to ``root`` and remove it."""
    # The worker was usually killed while held: an exiting task cannot be moved, and it stays in the group (whose
    # removal fails with EBUSY) until it has had the CPU to finish exiting. Lift the quota so that it gets it, and
    # retry until the group is empty.
    (group / "cpu.cfs_quota_us").write_text("-1")
    deadline = time.monotonic() + 10.0
    while True:
        for process in (group / "cgroup.procs").read_text().split():
            try:
                (root / "cgroup.procs").write_text(process)
            except OSError:
                pass  # exiting or gone
        try:
            group.rmdir()
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def test_a_process_kept_off_its_cpu_is_held_by_the_machine_and_the_one_that_ran_is_not() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with spinning_on(cpu) as busy, spinning_on(cpu) as starved:
        idle(starved.pid)
        time.sleep(0.2)  # the scheduler has taken the new policy into account
        watches = {p.pid: Watch(p.pid) for p in (busy, starved)}
        before = {pid: watch.cpu_time() for pid, watch in watches.items()}
        time.sleep(1.0)
        waits = {pid: since(before[pid], watch.schedule()) for pid, watch in watches.items()}
    kept_off, ran = waits[starved.pid], waits[busy.pid]
    assert kept_off is not None and ran is not None
    assert kept_off.held_by_machine(1.0), kept_off.describe()
    # The spinner at normal priority may share its CPU with this machine's other work, but it ran.
    assert ran.ran_ns > 5 * kept_off.ran_ns, (ran.describe(), kept_off.describe())


def test_a_process_asleep_past_its_deadline_is_not_held_by_the_machine() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)  # started and asleep
        watch = Watch(sleeper.pid)
        before = watch.cpu_time()
        time.sleep(0.5)
        wait = since(before, watch.schedule())
    finally:
        sleeper.kill()
        sleeper.wait()
    assert wait is not None
    assert not wait.runnable, wait.describe()
    assert not wait.held_by_machine(0.5)


def test_a_process_gone_or_never_there_has_no_reading() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    watch = Watch(process.pid)
    assert watch.cpu_time() is not None and watch.schedule() is not None
    process.wait()
    assert watch.cpu_time() is None and watch.schedule() is None
    assert Watch(process.pid).cpu_time() is None
    assert since(None, Watch(os.getpid()).schedule()) is None


def test_the_cpu_time_counts_every_thread_and_the_ended_ones() -> None:
    # Two threads spin for about 0.3 s of CPU each, then end; the process sleeps on. Its CPU time keeps theirs.
    code = (
        "import threading, time\n"
        "def spin():\n"
        "    end = time.thread_time() + 0.3\n"
        "    while time.thread_time() < end: pass\n"
        "threads = [threading.Thread(target=spin) for _ in range(2)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print('done', flush=True); time.sleep(30)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        watch = Watch(process.pid)
        assert process.stdout is not None and process.stdout.readline() == b"done\n"
        cpu = watch.cpu_time()
        assert cpu is not None and cpu.ran_ns >= 0.6e9, cpu
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def never_returns(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    cache = tmp_path_factory.mktemp("kf-cache")
    result = compile_source(load_problem("softmax"), NEVER_RETURNS, DEFAULT_FLAGS, cache_dir=cache)
    assert result.verdict == Verdict.ok and result.artifact_id is not None, result.first_error
    return result.artifact_id, cache


def run_one_trial(artifact: str, cache: Path, starve: bool, call_timeout_s: float = CALL_TIMEOUT_S) -> Failed:
    """One trial of a kernel that never returns, its worker starved of its CPU or not; the failure."""
    problem = load_problem("softmax")
    lease = CpuLease(1)
    contender = Contender(
        problem,
        label="candidate",
        kind="artifact",
        artifact_id=artifact,
        threads=1,
        cpus=lease.cpus,
        limits=validation_limits(problem, 4, call_timeout_s),
        cache_dir=cache,
    )
    try:
        assert contender.worker_pid is not None
        groups = plan_trials(problem, "validation", 1, 0)[:1]
        with pytest.raises(Failed) as failed, throttled(contender.worker_pid) if starve else nullcontext():
            TrialRunner(problem, contender, call_timeout_s).run(groups)
        return failed.value
    finally:
        contender.discard()
        lease.release()


def test_a_kernel_that_never_returns_is_a_timeout_when_it_had_its_cpu(never_returns: tuple[str, Path]) -> None:
    failure = run_one_trial(*never_returns, starve=False)
    assert failure.verdict == Verdict.timeout, failure


def test_a_deadline_missed_while_the_machine_kept_the_worker_off_its_cpu_is_no_verdict(
    never_returns: tuple[str, Path],
) -> None:
    """The same kernel misses the same deadline; the worker spent it waiting for a CPU another process held,
    so the miss is the machine's: a harness error, which the search retries and never records as a verdict."""
    started = time.monotonic()
    failure = run_one_trial(*never_returns, starve=True)
    assert failure.verdict == Verdict.harness_error, failure
    assert "too busy" in failure.message and "waiting for one" in failure.message, failure
    # It was given more time before the machine was blamed.
    assert time.monotonic() - started >= (STARVED_PATIENCE + 1) * CALL_TIMEOUT_S


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the kernel makes raw x86-64 system calls")
def test_a_kernel_that_sleeps_and_spins_only_at_its_deadlines_is_a_timeout(tmp_path: Path) -> None:
    """At each deadline it is runnable with little CPU time, as a starved worker is; in the looks the parent
    takes while it waits it is asleep, as a starved worker never is. Its miss is its own, at the first deadline,
    not the machine's after STARVED_PATIENCE more."""
    result = compile_source(load_problem("softmax"), DEADLINE_SPINNER, DEFAULT_FLAGS, cache_dir=tmp_path)
    assert result.verdict == Verdict.ok and result.artifact_id is not None, result.first_error
    started = time.monotonic()
    failure = run_one_trial(result.artifact_id, tmp_path, starve=False, call_timeout_s=SPINNER_TIMEOUT_S)
    assert failure.verdict == Verdict.timeout, failure
    assert time.monotonic() - started < 2 * SPINNER_TIMEOUT_S
