"""The sandbox: limits, clean environment, private directory, affinity, and no process outliving a run.

Commands here are small Python programs run under engine/harness/child.py's init, exactly as candidates
and the compiler are. Tests that need namespaces are skipped where the machine has none; the
process-group fallback is tested everywhere.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path

import pytest
from process_table import survivors

from engine.harness.sandbox import CpuLease, Isolation, Sandbox, SandboxLimits, SandboxOutcome, isolation_support

NAMESPACES = isolation_support().isolation == Isolation.namespaces
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="unshare(1) namespaces unavailable here")
ISOLATIONS = ["auto", "process-group"]


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
        assert oct(directory.stat().st_mode & 0o777) == oct(0o700)
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
