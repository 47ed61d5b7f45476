"""The sandbox: limits, clean environment, private directory, affinity, privileges, and no process
outliving a run or its supervisor.

Commands here are small Python programs run under engine/harness/init.py, exactly as candidates and the
compiler are. Tests that need namespaces are skipped where the machine has none, tests of the uid drop
where the tests do not run as root; the process-group fallback is tested everywhere.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from process_table import processes_with_argument, survivors

from engine.harness import sandbox as sandbox_module
from engine.harness.sandbox import (
    PRIVATE_PREFIX,
    CpuLease,
    Isolation,
    Sandbox,
    SandboxLimits,
    SandboxOutcome,
    isolation_support,
    sweep_stale_directories,
)

NAMESPACES = isolation_support().isolation == Isolation.namespaces
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="unshare(1) namespaces unavailable here")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only a root supervisor has a uid to drop to")
ISOLATIONS = ["auto", "process-group"]
SCRATCH_BASES = [Path("/dev/shm"), Path(tempfile.gettempdir())]


def run_python(code: str, limits: SandboxLimits | None = None, isolation: str = "auto") -> tuple[str, SandboxOutcome]:
    with Sandbox(isolation=isolation) as sandbox:
        outcome = sandbox.run([sys.executable, "-I", "-c", code], limits or SandboxLimits(wall_seconds=60))
    return outcome.output_tail, outcome


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_environment_is_clean(isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_TEST_SECRET", "sk-" + secrets.token_hex(8))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    output, _ = run_python("import os, json; print(json.dumps(dict(os.environ)))", isolation=isolation)
    environment = json.loads(output.strip().splitlines()[-1])
    assert "KF_TEST_SECRET" not in environment and "OPENAI_API_KEY" not in environment
    assert set(environment) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "BLIS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "OMP_WAIT_POLICY",
        "KF_SANDBOX_TOKEN",
    }
    assert environment["HOME"] == environment["TMPDIR"]
    assert environment["OMP_NUM_THREADS"] == "1"


def test_limits_and_affinity_apply() -> None:
    limits = SandboxLimits(wall_seconds=60, cpu_seconds=77, address_space_bytes=3 << 30, file_size_bytes=5 << 20)
    code = (
        "import os, resource, json; print(json.dumps({'as': resource.getrlimit(resource.RLIMIT_AS)[0], "
        "'cpu': resource.getrlimit(resource.RLIMIT_CPU)[0], 'fsize': resource.getrlimit(resource.RLIMIT_FSIZE)[0], "
        "'core': resource.getrlimit(resource.RLIMIT_CORE)[1], 'cpus': sorted(os.sched_getaffinity(0))}))"
    )
    with Sandbox(threads=1) as sandbox:
        outcome = sandbox.run([sys.executable, "-I", "-c", code], limits)
        seen = json.loads(outcome.output_tail.strip().splitlines()[-1])
        assert seen == {"as": 3 << 30, "cpu": 77, "fsize": 5 << 20, "core": 0, "cpus": sandbox.cpus}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_wall_clock_limit_kills_a_hang(isolation: str) -> None:
    _, outcome = run_python("import time; time.sleep(600)", SandboxLimits(wall_seconds=1), isolation=isolation)
    assert outcome.killed and "wall-clock" in outcome.killed


def test_a_crash_reports_its_signal() -> None:
    _, outcome = run_python("import os; os.abort()")
    assert outcome.signal == 6


def test_watch_can_stop_a_run() -> None:
    with Sandbox() as sandbox:
        outcome = sandbox.run(
            [sys.executable, "-I", "-c", "import time; time.sleep(600)"],
            SandboxLimits(wall_seconds=120),
            watch=lambda: "stop: seen enough",
        )
    assert outcome.killed == "stop: seen enough"


DAEMON = """
import ctypes, os, sys, time
token = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, ("kfs" + token).encode(), 0, 0, 0)  # PR_SET_NAME
        time.sleep(60)
    os._exit(0)
time.sleep(0.3)
"""


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_descendant_outlives_the_run(isolation: str) -> None:
    token = secrets.token_hex(4)
    with Sandbox(isolation=isolation) as sandbox:
        outcome = sandbox.run([sys.executable, "-I", "-c", DAEMON, token], SandboxLimits(wall_seconds=60))
    assert outcome.exit_code == 0
    assert outcome.leftover + int(outcome.status.get("swept", 0)) >= 1  # the daemon was found and killed
    deadline = time.monotonic() + 2
    while survivors(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert survivors(token) == []


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_descendant_outlives_a_timeout(isolation: str) -> None:
    token = secrets.token_hex(4)
    hang = DAEMON.replace("time.sleep(0.3)", "time.sleep(600)")
    with Sandbox(isolation=isolation) as sandbox:
        outcome = sandbox.run([sys.executable, "-I", "-c", hang, token], SandboxLimits(wall_seconds=1.5))
    assert outcome.killed
    deadline = time.monotonic() + 2
    while survivors(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert survivors(token) == []


def test_private_directory_is_removed() -> None:
    with Sandbox() as sandbox:
        (sandbox.dir / "scratch").write_text("x")
        directory = sandbox.dir
        assert directory.name.startswith(f"{PRIVATE_PREFIX}{os.getpid()}-")
        mode = directory.stat().st_mode
        assert mode & 0o007 == 0  # nothing for other users
        if sandbox.late_drop is not None:  # the worker's group after its drop; it cannot remove root's files
            assert (mode & 0o7777, directory.stat().st_gid) == (0o1770, sandbox.late_drop[1])
        else:
            assert mode & 0o777 == 0o700
    assert not directory.exists()


@needs_namespaces
def test_only_the_private_directory_is_writable(tmp_path: Path) -> None:
    outside = tmp_path / "written-by-the-sandbox"
    code = (
        "import os, sys\n"
        "for path in (sys.argv[1], os.environ['TMPDIR'] + '/inside'):\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('wrote', path)\n"
        "    except OSError as error: print('refused', path, error.errno)\n"
    )
    with Sandbox() as sandbox:
        outcome = sandbox.run([sys.executable, "-I", "-c", code, str(outside)], SandboxLimits(wall_seconds=60))
    assert f"refused {outside}" in outcome.output_tail
    assert "wrote" in outcome.output_tail and not outside.exists()


@needs_namespaces
def test_no_network() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
            "except OSError as error: print('no network', error)\n"
        )
        output, _ = run_python(code)
        assert "no network" in output
        with pytest.raises(BlockingIOError):
            listener.accept()


@needs_namespaces
def test_no_capabilities_and_own_process_view() -> None:
    code = (
        "import os\n"
        "status = open('/proc/self/status').read()\n"
        "print('capeff', status.split('CapEff:')[1].split()[0])\n"
        "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    output, _ = run_python(code)
    assert "capeff 0000000000000000" in output
    assert "pids [1, 2]" in output  # the sandbox's init and this process: nothing of the host


def test_cpu_leases_keep_sandboxes_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuLease, "DIRECTORY", tmp_path)  # not the machine's: other runs may hold those
    cpus = len(os.sched_getaffinity(0))
    leases = [CpuLease(1) for _ in range(cpus)]
    try:
        assert all(lease.exclusive for lease in leases)
        assert len({lease.cpus[0] for lease in leases}) == cpus  # one CPU each
        crowded = CpuLease(1)
        assert not crowded.exclusive and len(crowded.cpus) == 1  # none free: shares, and says so
        crowded.release()
    finally:
        for lease in leases:
            lease.release()
    again = CpuLease(1)
    assert again.exclusive
    again.release()


# ----------------------------------------------------------------------------------------- privileges

PROBE_PRIVILEGES = """
import json, os, sys
from engine.harness.privileges import drop_privileges

def capabilities():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return {key: int(fields[key], 16) for key in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb")}

before = capabilities()
drop_to = json.loads(sys.argv[2])
if drop_to:
    drop_privileges(*drop_to)
readable = {}
for path in (sys.argv[1], "/etc/shadow"):
    try:
        open(path).read()
        readable[path] = True
    except PermissionError:
        readable[path] = False
    except FileNotFoundError:
        pass
open("written-after-the-drop", "w").write("x")
print(json.dumps({"before": before, "after": capabilities(), "uids": os.getresuid(), "readable": readable}))
"""


@needs_root
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_worker_that_drops_late_cannot_read_what_root_owns(isolation: str, tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    with Sandbox(isolation=isolation) as sandbox:
        outcome = sandbox.run(
            [sys.executable, "-I", "-c", PROBE_PRIVILEGES, str(secret), json.dumps(sandbox.late_drop)],
            SandboxLimits(wall_seconds=60),
            late_drop=True,
        )
        assert outcome.exit_code == 0, outcome.output_tail
        seen = json.loads(outcome.output_tail.strip().splitlines()[-1])
        assert (sandbox.dir / "written-after-the-drop").is_file()  # the private directory stays usable
    assert 0 not in seen["uids"]
    assert seen["readable"][str(secret)] is False
    assert not any(seen["readable"].values())
    assert not any(seen["after"].values())  # no capability in any set
    if sandbox.late_drop is not None:  # this machine's case: the interpreter is unreadable to nobody
        setid = 1 << 6 | 1 << 7  # CAP_SETGID, CAP_SETUID
        assert seen["before"] == {"CapEff": setid, "CapPrm": setid, "CapBnd": 0, "CapInh": setid, "CapAmb": 0}


PRINT_CAPEFF = "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])"


def test_plain_commands_never_drop_late() -> None:
    """Only the worker is started with the two capabilities it needs to change user: nothing else."""
    output, _ = run_python(PRINT_CAPEFF)
    assert output.strip() == "0000000000000000"


@needs_root
def test_the_worker_command_is_started_for_the_late_drop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = tmp_path / "worker.py"
    stand_in.write_text(PRINT_CAPEFF)
    monkeypatch.setattr(sandbox_module, "HARNESS_WORKER", stand_in)
    with Sandbox() as sandbox:
        outcome = sandbox.run(sandbox.worker_command(), SandboxLimits(wall_seconds=60))
    expected = "00000000000000c0" if sandbox.late_drop is not None else "0000000000000000"
    assert outcome.output_tail.strip() == expected


@needs_root
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_descendants_of_a_dropped_worker_do_not_outlive_the_run(isolation: str) -> None:
    token = secrets.token_hex(4)
    code = "import json, sys\nfrom engine.harness.privileges import drop_privileges\n"
    code += "drop_to = json.loads(sys.argv[2])\nif drop_to:\n    drop_privileges(*drop_to)\n"
    code += DAEMON
    with Sandbox(isolation=isolation) as sandbox:
        outcome = sandbox.run(
            [sys.executable, "-I", "-c", code, token, json.dumps(sandbox.late_drop)],
            SandboxLimits(wall_seconds=60),
            late_drop=True,
        )
    assert outcome.exit_code == 0, outcome.output_tail
    assert outcome.leftover + int(outcome.status.get("swept", 0)) >= 1
    deadline = time.monotonic() + 2
    while survivors(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert survivors(token) == []


# ------------------------------------------------------------------------------------ start, handle

ECHO_ON_DESCRIPTORS = """
import os, sys
commands, replies = int(sys.argv[1]), int(sys.argv[2])
line = os.read(commands, 100)
os.write(replies, line.upper() + b" " + " ".join(sorted(os.listdir("/proc/self/fd"))).encode())
"""


def test_start_talks_to_the_command_over_the_descriptors_it_passes() -> None:
    commands_read, commands_write = os.pipe()
    replies_read, replies_write = os.pipe()
    unrelated_read, unrelated_write = os.pipe()
    os.set_inheritable(unrelated_read, True)  # inheritable, but not passed: must not reach the command
    try:
        with Sandbox() as sandbox:
            handle = sandbox.start(
                [sys.executable, "-I", "-c", ECHO_ON_DESCRIPTORS, str(commands_read), str(replies_write)],
                SandboxLimits(wall_seconds=60),
                pass_fds=(commands_read, replies_write),
            )
            os.close(commands_read)
            os.close(replies_write)
            assert handle.poll() is None and handle.remaining_s > 0
            os.write(commands_write, b"hello")
            reply = os.read(replies_read, 1000).decode().split()
            outcome = handle.finish()
            assert handle.finish() is outcome
    finally:
        for fd in (commands_write, replies_read, unrelated_read, unrelated_write):
            os.close(fd)
    assert outcome.exit_code == 0 and outcome.killed is None
    # Standard input, output, error, the two pipes, and the descriptor listdir itself had open.
    assert reply[0] == "HELLO" and len(reply[1:]) == 6
    assert {str(commands_read), str(replies_write)} <= set(reply[1:])


def test_finish_enforces_the_wall_clock_limit_and_kill_records_why() -> None:
    with Sandbox() as sandbox:
        command = [sys.executable, "-I", "-c", "import time; time.sleep(600)"]
        timed_out = sandbox.start(command, SandboxLimits(wall_seconds=1)).finish()
        assert timed_out.killed and "wall-clock" in timed_out.killed
        handle = sandbox.start(command, SandboxLimits(wall_seconds=60))
        handle.kill("the judge has seen enough")
        assert handle.finish().killed == "the judge has seen enough"


# ----------------------------------------------------------------------- death of the supervisor

SUPERVISOR = """
import sys
from engine.harness.sandbox import Sandbox, SandboxLimits
token, isolation = sys.argv[1], sys.argv[2]
sandbox = Sandbox(isolation=isolation, pin=False)
print(sandbox.dir, flush=True)
command = [sys.executable, "-I", "-c", "import time; print('ready', flush=True); time.sleep(600)", token]
sandbox.start(command, SandboxLimits(wall_seconds=600)).finish()
"""


def _first_sandbox_in_a_new_process() -> None:
    code = "from engine.harness.sandbox import Sandbox\nSandbox(pin=False).close()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_killed_supervisor_takes_its_sandbox_down(isolation: str) -> None:
    token = secrets.token_hex(8)
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, token, isolation], stdout=subprocess.PIPE, text=True
    )
    try:
        assert supervisor.stdout is not None
        directory = Path(supervisor.stdout.readline().strip())
        deadline = time.monotonic() + 60
        while "ready" not in _read(directory / "output.log") and time.monotonic() < deadline:
            time.sleep(0.05)
        sandboxed = [p for p in processes_with_argument(token) if p.pid != supervisor.pid]
        assert sandboxed, "the sandboxed command never started"
    finally:
        supervisor.kill()
        supervisor.wait()
    _, alive = psutil.wait_procs(sandboxed, timeout=5)
    assert alive == []
    # Nobody was left to remove the directory: the next process to create a sandbox sweeps it (on a shared
    # machine that may be another one, first).
    _first_sandbox_in_a_new_process()
    assert not directory.exists()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_the_sweep_spares_every_live_directory(tmp_path: Path) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    stale = tmp_path / f"{PRIVATE_PREFIX}{pid_max + 1}-{secrets.token_hex(8)}"
    being_created = tmp_path / f"{PRIVATE_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"  # alive, not yet locked
    elsewhere = tmp_path / f"{PRIVATE_PREFIX}{pid_max + 2}-{secrets.token_hex(8)}"  # locked: another PID namespace
    older_naming = tmp_path / f"{PRIVATE_PREFIX}abc123_x"
    for directory in (stale, being_created, elsewhere, older_naming):
        directory.mkdir()
        (directory / "scratch").write_text("x")
    lock = os.open(elsewhere, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with Sandbox(pin=False) as live:
            assert sweep_stale_directories([tmp_path]) == [stale]
            assert live.dir not in sweep_stale_directories([live.dir.parent])
            assert live.dir.is_dir()
    finally:
        os.close(lock)
    assert being_created.is_dir() and elsewhere.is_dir() and older_naming.is_dir()


SPINNING_KERNEL = """
#include <stdint.h>
void softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    volatile int spin = 1;
    while (spin) {
    }
}
"""


def test_a_terminated_kf_evaluate_leaves_nothing_behind(tmp_path: Path) -> None:
    source = tmp_path / "spin.c"
    source.write_text(SPINNING_KERNEL)
    kf = Path(sys.executable).with_name("kf")
    evaluate = subprocess.Popen(
        [str(kf), "evaluate", "--problem", "softmax", "--source", str(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        worker = None
        deadline = time.monotonic() + 120
        while worker is None and evaluate.poll() is None and time.monotonic() < deadline:
            worker = next((p for p in _descendants(evaluate.pid) if "worker.py" in " ".join(_argv(p))), None)
            time.sleep(0.01)
        assert worker is not None, "kf evaluate never started its worker"
        sandboxed = _descendants(evaluate.pid)
        directories = [path for base in SCRATCH_BASES for path in base.glob(f"{PRIVATE_PREFIX}{evaluate.pid}-*")]
        assert directories
        evaluate.send_signal(signal.SIGTERM)
        output, _ = evaluate.communicate(timeout=60)
    finally:
        if evaluate.poll() is None:
            evaluate.kill()
            evaluate.wait()
    assert evaluate.returncode == 143, output
    _, alive = psutil.wait_procs(sandboxed, timeout=5)
    assert alive == []
    assert [path for path in directories if path.exists()] == []


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _argv(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
