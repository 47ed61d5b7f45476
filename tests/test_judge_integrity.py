"""The judge's integrity: a candidate cannot touch its own measurements (tests/hostile/).

Each hostile kernel attacks what the judge relies on -- files, descriptors, raw system calls, the memory
next to its buffers, sampled or uninitialised inputs -- and must get a rejecting verdict, or an honest
number. The protocol between the judge and its workers is checked on its own too.
"""

from __future__ import annotations

import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from engine.errors import ProblemDefinitionError
from engine.harness import protocol as p
from engine.harness.benchmarking import Reference, benchmark_artifact
from engine.harness.cpu import DEFAULT_FLAGS, artifact_path, compile_source
from engine.harness.driver import Contender, Failed
from engine.harness.sandbox import CpuLease
from engine.harness.validation import TrialRunner, plan_trials, validate_artifact, validation_limits
from engine.harness.verdicts import Verdict
from engine.problems import Problem, load_problem

HOSTILE = Path(__file__).parent / "hostile"
ROOT = Path(__file__).parent.parent
SEEDS = 1
CALL_TIMEOUT_S = 2.0
BUDGET_S = 0.3
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="the hostile kernels use x86-64 inline assembly")


def header(source: str) -> dict[str, str]:
    fields = {}
    for line in source.splitlines():
        match = re.match(r"//\s*(\w[\w-]*):\s*(.+)", line)
        if not match:
            break
        fields[match.group(1)] = match.group(2).strip()
    return fields


def hostile_source(name: str) -> str:
    """The file with raw.h and libc_symbol.h pasted in (a candidate is one source file)."""
    source = (HOSTILE / name).read_text()
    for header_file in ("raw.h", "libc_symbol.h"):
        source = source.replace(f'#include "{header_file}"', (HOSTILE / header_file).read_text())
    return source


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kf-cache")


def compiled(source: str, cache: Path) -> str:
    result = compile_source(load_problem("softmax"), source, DEFAULT_FLAGS, cache_dir=cache)
    assert result.verdict == Verdict.ok, result.first_error
    assert result.artifact_id is not None
    return result.artifact_id


@x86_64
@pytest.mark.parametrize(
    "name", sorted(f.name for f in HOSTILE.glob("*.c") if "dedicated" not in header(f.read_text()))
)
def test_hostile_kernel_gets_its_verdict(name: str, cache: Path) -> None:
    source = hostile_source(name)
    expect = header(source)
    problem = load_problem("softmax")
    report = validate_artifact(
        problem, compiled(source, cache), seeds=SEEDS, cache_dir=cache, call_timeout_s=CALL_TIMEOUT_S
    )
    assert report.verdict == expect["expect"], report.model_dump_json(indent=1)
    if "check" in expect:
        assert report.cases and report.cases[0].check == expect["check"], report.cases
    assert report.cases and report.cases[0].message


@x86_64
def test_refused_system_call_is_named(cache: Path) -> None:
    report = validate_artifact(
        load_problem("softmax"),
        compiled(hostile_source("raw_socket.c"), cache),
        seeds=SEEDS,
        cache_dir=cache,
        call_timeout_s=CALL_TIMEOUT_S,
    )
    assert report.verdict == Verdict.forbidden
    assert "socket" in report.message, report.message


@x86_64
def test_nothing_is_written_outside_the_sandbox(cache: Path) -> None:
    marker = Path("/dev/shm/kf-owned")
    marker.unlink(missing_ok=True)
    validate_artifact(
        load_problem("softmax"),
        compiled(hostile_source("rewrite_files_on_nth_call.c"), cache),
        seeds=SEEDS,
        cache_dir=cache,
        call_timeout_s=CALL_TIMEOUT_S,
    )
    assert not marker.exists()


@x86_64
def test_scribbling_on_the_harness_late_gains_nothing(cache: Path) -> None:
    problem = load_problem("softmax")
    plain = compiled((HOSTILE / "raw.h").read_text().replace("static void softmax_rows", "void softmax"), cache)
    scribbler = compiled(hostile_source("late_scribbler.c"), cache)
    assert validate_artifact(problem, scribbler, seeds=SEEDS, cache_dir=cache).verdict == Verdict.ok
    (report,) = benchmark_artifact(
        problem,
        scribbler,
        [Reference(kind="artifact", artifact_id=plain, label="plain")],
        budget_s=BUDGET_S,
        cache_dir=cache,
        call_timeout_s=CALL_TIMEOUT_S,
        noise_floor=0.02,
    )
    # Rejected (it corrupts memory the harness checks), or timed honestly: never a clear win.
    assert report.verdict != Verdict.ok or report.ci_low < 1.05, report.model_dump_json(indent=1)


@x86_64
@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the kernel walks CPython 3.11's frames")
def test_a_kernel_that_shortens_the_batch_loop_is_caught(cache: Path) -> None:
    """A kernel that reached the worker's Python from C (dlsym found through libc's ELF symbols) and cut the
    batch loop's range to a quarter read 4x faster than its loops are, every output it left correct. The parent
    now checks each fetched output against the call it must be by its own count of the calls it asked for."""
    problem = load_problem("softmax")
    source = hostile_source("shortens_the_batch_loop.c")
    artifact = compiled(source, cache)
    assert validate_artifact(problem, artifact, seeds=SEEDS, cache_dir=cache).verdict == Verdict.ok
    (report,) = benchmark_artifact(
        problem,
        artifact,
        [Reference(kind="numpy", label="numpy")],
        budget_s=BUDGET_S,
        cache_dir=cache,
        call_timeout_s=CALL_TIMEOUT_S,
        noise_floor=0.02,
    )
    assert report.verdict == header(source)["expect"], report.model_dump_json(indent=1)
    assert report.cases[0].check == "timed_output", report.cases
    assert "not the calls it was asked to run" in report.message, report.message


def test_a_kernel_that_reuses_work_across_calls_is_caught(cache: Path) -> None:
    """A matmul that kept each input slot's inputs and answer and recomputed only the rows the drift changed
    gave exact outputs 4x faster than its own loops (the rounds reuse every input slot). Timed on inputs no call
    has read, it is as slow as it is; the same loops without the memo are timed as before."""
    problem = load_problem("matmul")
    source = (HOSTILE / "memoizes_changed_rows.c").read_text()
    verdicts = {}
    for label, text in (("memo", source), ("honest", "#define NOMEMO 1\n" + source)):
        result = compile_source(problem, text, DEFAULT_FLAGS, cache_dir=cache)
        assert result.artifact_id is not None, result.first_error
        assert validate_artifact(problem, result.artifact_id, seeds=SEEDS, cache_dir=cache).verdict == Verdict.ok
        (report,) = benchmark_artifact(
            problem,
            result.artifact_id,
            [Reference(kind="numpy", label="numpy")],
            budget_s=BUDGET_S,
            cache_dir=cache,
            call_timeout_s=CALL_TIMEOUT_S,
            noise_floor=0.02,
        )
        verdicts[label] = report
    memo, honest = verdicts["memo"], verdicts["honest"]
    assert memo.verdict == header(source)["expect"], memo.model_dump_json(indent=1)
    assert memo.cases[0].check == header(source)["check"] and "inputs no call had read" in memo.message
    assert honest.verdict == Verdict.ok, honest.model_dump_json(indent=1)


@pytest.mark.parametrize(
    ("folder", "defines"),
    [("matmul_bf16", "#define BF16_INPUTS 1\n"), ("matmul_i32", "#define INT32_INPUTS 1\n")],
    ids=["bfloat16 inputs", "integer inputs"],
)
def test_a_kernel_that_reuses_work_on_inputs_the_judge_did_not_vary_is_caught(
    folder: str, defines: str, cache: Path
) -> None:
    """The same memo on problems whose inputs the judge left as drawn between timed calls (users' folders under
    tests/hostile/problems), so every timed call after a slot's first recomputed nothing, every output exact:
    on bfloat16 inputs 12.4x numpy where its own loops make 0.68x (the drift and the probe's refresh changed
    float inputs only), on integer ones (which cannot be changed: an index could leave its range) the probe was
    skipped. bfloat16 inputs now drift and are refreshed (rounded back to bfloat16); a problem with integer
    inputs only is probed on new pools of secret seeds. The loops without the memo are timed ok (the CPU worker
    takes bfloat16 arrays at all: it once failed on them, and called that the seed's crash)."""
    problem = load_problem(str(HOSTILE / "problems" / folder))
    kernel = (HOSTILE / "memoizes_changed_rows.c").read_text()
    expect = header(kernel)
    reports = {}
    for label, text in (("memo", defines + kernel), ("honest", "#define NOMEMO 1\n" + defines + kernel)):
        result = compile_source(problem, text, DEFAULT_FLAGS, cache_dir=cache)
        assert result.artifact_id is not None, result.first_error
        assert validate_artifact(problem, result.artifact_id, seeds=SEEDS, cache_dir=cache).verdict == Verdict.ok
        (reports[label],) = benchmark_artifact(
            problem,
            result.artifact_id,
            [Reference(kind="numpy", label="numpy")],
            # A pool holds about a hundred input slots of this shape: the memo pays off once each slot is reused
            # many times, which takes a longer budget than the other kernels here need.
            budget_s=1.0,
            cache_dir=cache,
            call_timeout_s=CALL_TIMEOUT_S,
            noise_floor=0.02,
        )
    memo, honest = reports["memo"], reports["honest"]
    assert memo.verdict == expect["expect"], memo.model_dump_json(indent=1)
    assert memo.cases[0].check == expect["check"] and "inputs no call had read" in memo.message
    assert honest.verdict == Verdict.ok, honest.model_dump_json(indent=1)


def _timed_seed(folder: Path, cache: Path) -> Any:
    problem = load_problem(str(folder))
    result = compile_source(problem, (folder / "seed.c").read_text(), DEFAULT_FLAGS, cache_dir=cache)
    assert result.artifact_id is not None, result.first_error
    (report,) = benchmark_artifact(
        problem, result.artifact_id, [Reference(kind="numpy", label="numpy")], budget_s=BUDGET_S, cache_dir=cache
    )
    return report


def test_an_input_a_small_change_makes_invalid_can_be_left_as_drawn(tmp_path: Path, cache: Path) -> None:
    """The judge varies float inputs between timed calls; a folder marks the ones it must not touch "vary": False.
    Sorted edges (tests/user_problems/bucketize) stay sorted, so a correct binary search is timed ok (refreshed,
    they were unsorted and it was judged incorrect). Probabilities just under 1 (log1m) drifted past 1 gave the
    reference a NaN, blamed on make_inputs: now the error names the judge's variation and the mark; with the
    mark, the seed is timed ok."""
    assert _timed_seed(ROOT / "tests" / "user_problems" / "bucketize", cache).verdict == Verdict.ok
    folder = tmp_path / "log1m"
    shutil.copytree(ROOT / "tests" / "user_problems" / "log1m", folder)
    source = (folder / "problem.py").read_text().replace("rng.uniform(0.0, 0.99, n)", "rng.uniform(0.98, 0.99, n)")
    (folder / "problem.py").write_text(source)
    with pytest.raises(
        ProblemDefinitionError, match=r"inputs the judge varied between timed calls \(p: .*'vary': False"
    ):
        _timed_seed(folder, cache)
    marked = '{"name": "p", "role": "in", "dtype": "float32", "shape": ["n"], "vary": False}'
    (folder / "problem.py").write_text(
        source.replace('{"name": "p", "role": "in", "dtype": "float32", "shape": ["n"]}', marked)
    )
    assert _timed_seed(folder, cache).verdict == Verdict.ok


def test_a_problem_whose_timed_answers_are_one_value_is_refused_not_timed(tmp_path: Path, cache: Path) -> None:
    """relu timed on inputs that are all negative: every answer is 0, and stays 0 when the judge drifts an element
    by a small step, so a kernel that writes zeros without reading x passes every timed check and would be timed
    as a memset. The judge refuses the problem (the problem's error, exit status 2 in kf evaluate); with the
    typical inputs timed, the seed is timed ok."""
    assert _timed_seed(ROOT / "tests" / "user_problems" / "relu", cache).verdict == Verdict.ok
    folder = tmp_path / "relu"
    shutil.copytree(ROOT / "tests" / "user_problems" / "relu", folder)
    source = (folder / "problem.py").read_text()
    (folder / "problem.py").write_text(source.replace('["mixed", "negative"]', '["negative", "mixed"]'))
    with pytest.raises(
        ProblemDefinitionError, match=r"every answer of a timed call .* is one value .*\(y 0\) on the 'negative'"
    ):
        _timed_seed(folder, cache)


def test_bfloat16_inputs_drift_and_refresh_to_values_of_their_own() -> None:
    """bfloat16 bits (uint16) change at every drift step and every refresh, by about the float drift's size, and
    an infinity or NaN stays as it is: every use of a slot is an input of its own, as with float inputs. A second
    refresh brings back neither the drawn pool nor the first refresh's (a shrink after a growth of 1/64 would
    round back to the drawn value in bfloat16)."""
    rng = np.random.default_rng(7)
    values = (rng.standard_normal(4096) * 10.0 ** rng.integers(-3, 4, 4096)).astype(np.float32)
    wide = values.view(np.uint32)
    bits = ((wide + (0x7FFF + ((wide >> 16) & 1))) >> 16).astype(np.uint16)
    special = np.array([0x7F80, 0xFF80, 0x7FC0, 0xFFC1], dtype=np.uint16)  # +-inf and NaNs
    steps = p.drift_steps(np, bits.dtype)
    for step in steps:
        drifted = np.array([p.drift_value(b, step) for b in bits], dtype=np.uint16)
        assert np.all(drifted != bits)
        moved = np.abs(_from_bf16(drifted) - _from_bf16(bits))
        assert np.all(moved <= np.maximum(2 * step, np.abs(_from_bf16(bits)) / 64))
        assert [int(p.drift_value(b, step)) for b in special] == [int(b) for b in special]
    pool = np.concatenate([bits, special])
    refreshed = pool.copy()
    p.apply_refresh(np, refreshed, p.refresh_factors(np, 99, 0, refreshed.size, refreshed.dtype))
    assert np.all(refreshed[: bits.size] != bits) and np.array_equal(refreshed[bits.size :], special)
    again = refreshed.copy()
    p.apply_refresh(np, again, p.refresh_factors(np, 100, 0, again.size, again.dtype))
    assert np.all(again[: bits.size] != bits) and np.all(again[: bits.size] != refreshed[: bits.size])
    spec = p.ParamSpec(name="x", role="in", dtype="bfloat16")
    assert p.varies(spec) and not p.varies(spec.model_copy(update={"vary": False}))
    assert not p.varies(spec.model_copy(update={"dtype": "int32"})) and not p.varies(
        spec.model_copy(update={"role": "out"})
    )


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def test_the_judge_replays_the_calls_it_asked_for() -> None:
    """What the parent works out of a call from its own count is what the worker's bookkeeping records: the
    slots in turn, a use's drift step, and an element that changes from call to call."""
    slots = 5
    uses = [0] * slots
    positions = set()
    for call in range(4 * slots * p.BUMP_CYCLE):
        slot, bump = p.timed_call_inputs(call, slots)
        assert slot == call % slots and bump == uses[slot] % p.BUMP_CYCLE
        uses[slot] += 1
        position = p.drift_position(12345, call, 1000)
        assert 0 <= position < 1000 and position == p.drift_position(12345, call, 1000)
        positions.add(position)
    assert len(positions) > 100  # not a few elements a kernel could watch
    assert p.drift_position(1, 7, 1) == 0 and p.drift_position(2, 7, 10**6) != p.drift_position(3, 7, 10**6)


def test_a_second_reply_nobody_asked_for_is_a_protocol_violation() -> None:
    read, write = os.pipe()
    try:
        p.write_message(write, p.Done(nonce=7, child_ns=1))
        p.write_message(write, p.Done(nonce=7, child_ns=1))
        reply, _ = p.read_reply(read, None)
        assert isinstance(reply, p.Done) and reply.nonce == 7
        assert p.pending(read)
    finally:
        os.close(read)
        os.close(write)


def test_a_child_that_ends_after_its_last_reply_sent_no_second_one() -> None:
    """The CUDA child writes its fault and exits: the end of the pipe is no reply (a race once made a kernel's
    fault a harness error when the child had closed the pipe before the parent looked)."""
    read, write = os.pipe()
    p.write_message(write, p.Done(nonce=7, child_ns=1))
    os.close(write)
    try:
        reply, _ = p.read_reply(read, None)
        assert isinstance(reply, p.Done)
        assert not p.pending(read)
    finally:
        os.close(read)


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xff\xff\xff", b"\x05\x00\x00\x00hello", b'\x0c\x00\x00\x00{"kind":"x"}'],
    ids=["huge", "not-json", "unknown-kind"],
)
def test_garbage_on_the_reply_pipe_is_refused(garbage: bytes) -> None:
    read, write = os.pipe()
    try:
        os.write(write, garbage)
        with pytest.raises(p.ProtocolError):
            p.read_reply(read, time.monotonic() + 5)
    finally:
        os.close(read)
        os.close(write)


def test_rounds_after_the_first_ten_are_checked_too(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked rounds were drawn from the first MIN_ROUNDS only, so a kernel that counted rounds could skip the
    work of every later one but its very last call. Later rounds are now checked as they end (at
    LATE_CHECK_RATE; here every one, to see each of them fetched)."""
    import engine.harness.benchmarking as benchmarking

    monkeypatch.setattr(benchmarking, "LATE_CHECK_RATE", 1.0)
    fetched: list[int] = []
    timed: list[tuple[int, int]] = []  # (rounds, outputs checked) of each shape timed
    check, time_shape = benchmarking.check_timed_output, benchmarking._time_shape

    def counted(*args: Any, **kwargs: Any) -> Any:
        asked = args[6] if len(args) > 6 else kwargs.get("asked")
        if asked is None or not asked.refreshes:  # the rounds' outputs, not the fresh-input probe's
            fetched.append(1)
        return check(*args, **kwargs)

    def timing(*args: Any, **kwargs: Any) -> Any:
        before = len(fetched)
        rows, evidence = time_shape(*args, **kwargs)
        timed.append((len(rows), len(fetched) - before))
        return rows, evidence

    monkeypatch.setattr(benchmarking, "check_timed_output", counted)
    monkeypatch.setattr(benchmarking, "_time_shape", timing)
    problem = load_problem("softmax")
    seed = compiled(problem.seed_source(), cache)
    # How many rounds fit a budget depends on the machine's load: on a busy CI machine one second's shapes each
    # ended at MIN_ROUNDS, so the budget grows until some shape runs past them (every attempt is checked).
    for budget_s in (1.0, 3.0, 9.0):
        timed.clear()
        (report,) = benchmark_artifact(
            problem,
            seed,
            [Reference(kind="numpy", label="numpy")],
            budget_s=budget_s,
            cache_dir=cache,
            revalidate=False,
        )
        assert report.verdict == Verdict.ok, report.message
        for rounds, checked in timed:
            assert checked == rounds - benchmarking.MIN_ROUNDS + benchmarking.CHECKED_TIMED_CALLS, timed
        if any(rounds > benchmarking.MIN_ROUNDS for rounds, _ in timed):
            break
    else:
        pytest.fail(f"no shape ran past {benchmarking.MIN_ROUNDS} rounds even at {budget_s} s: {timed}")


# Reads one command the way the worker does, says so, and waits to be killed.
_READS_A_COMMAND = """
import sys, time
from engine.harness import protocol as p
p.read_command(0)
sys.stdout.write("read\\n")
sys.stdout.flush()
time.sleep(60)
"""


def test_a_commands_text_is_gone_from_the_workers_memory_once_read() -> None:
    """A kernel shares its worker's memory: a Go's text left behind in a freed buffer tells one that scans the
    heap which call of the batch the parent keeps (Go.keep). The reader wipes it, and so must every copy it
    makes (pydantic copies a bytearray before parsing it)."""
    nonce = secrets.randbits(62)
    reader = subprocess.Popen(
        [sys.executable, "-c", _READS_A_COMMAND], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
    )
    try:
        assert reader.stdin is not None and reader.stdout is not None
        p.write_message(reader.stdin.fileno(), p.Go(nonce=nonce, calls=1000, keep=123))
        assert reader.stdout.readline() == b"read\n"
        text = f'"nonce":{nonce}'.encode()
        found = []
        try:
            with open(f"/proc/{reader.pid}/maps") as maps:
                regions = [line.split()[:2] for line in maps]
            with open(f"/proc/{reader.pid}/mem", "rb", 0) as memory:
                for span, permissions in regions:
                    if "r" not in permissions:
                        continue
                    low, high = (int(end, 16) for end in span.split("-"))
                    try:
                        memory.seek(low)
                        if text in memory.read(high - low):
                            found.append(span)
                    except (OSError, ValueError, OverflowError):
                        continue  # [vvar] and the like cannot be read
        except PermissionError:
            pytest.skip("this machine does not let a process read its child's memory")
        assert not found, f"the Go's text is still in the reader's memory at {found}"
    finally:
        reader.kill()
        reader.wait()


def test_a_silent_worker_times_out() -> None:
    read, write = os.pipe()
    try:
        with pytest.raises(p.ChannelTimeout):
            p.read_reply(read, deadline=0.0)
    finally:
        os.close(read)
        os.close(write)


def test_a_library_swapped_in_the_cache_is_screened_before_it_is_loaded(cache: Path, tmp_path: Path) -> None:
    problem = load_problem("softmax")
    artifact = compiled(problem.seed_source() + "\n/* to be swapped */\n", cache)
    hostile = tmp_path / "hostile.c"
    hostile.write_text(
        problem.seed_source() + "\n__attribute__((constructor)) static void early(void) { __builtin_trap(); }\n"
    )
    # Built outside the harness (no screen, no -nostartfiles), then put where the artifact was.
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", str(artifact_path(artifact, cache)), str(hostile), "-lm"], check=True
    )
    report = validate_artifact(problem, artifact, seeds=SEEDS, cache_dir=cache, call_timeout_s=CALL_TIMEOUT_S)
    assert report.verdict == Verdict.forbidden, report.model_dump_json(indent=1)
    assert report.cases[0].check == "screen"


def started_contender(problem: Problem, artifact: str, threads: int, cache: Path) -> tuple[CpuLease, Contender]:
    """A candidate's sandboxed worker as validation starts it, and its CPU lease (release both)."""
    lease = CpuLease(threads)
    contender = Contender(
        problem,
        label="candidate",
        kind="artifact",
        artifact_id=artifact,
        threads=threads,
        cpus=lease.cpus,
        limits=validation_limits(problem, 4, CALL_TIMEOUT_S),
        cache_dir=cache,
    )
    return lease, contender


@x86_64
def test_a_worker_that_dies_after_its_last_reply_is_no_verdict_of_ok(cache: Path) -> None:
    """The judge's close asks the worker to finish; a worker that died in the meantime (here: a thread the
    candidate left behind ended the process after the trials) fails that, and the failure is the kernel's."""
    problem = load_problem("softmax")
    lease, contender = started_contender(problem, compiled(hostile_source("exits_between_calls.c"), cache), 2, cache)
    try:
        groups = plan_trials(problem, "validation", 1, 0)[:1]
        assert TrialRunner(problem, contender, CALL_TIMEOUT_S).run(groups) is None  # its answers are right
        time.sleep(1.0)  # the left-behind thread ends the process 0.2 s after the first call
        with pytest.raises(Failed) as failed:
            contender.close()
        assert failed.value.verdict == Verdict.crash, failed.value
        assert "finishing" in failed.value.message, failed.value
    finally:
        contender.discard()
        lease.release()


@x86_64
def test_a_single_threaded_worker_is_stopped_while_others_are_timed(cache: Path) -> None:
    """A kernel that took its worker's interpreter over could have it spin between batches, on the CPU the
    other contenders are timed on (it slowed numpy's reference from 2.0 to 3.6 ms); one thread or many, a paused
    worker is stopped, and it answers again once resumed."""
    problem = load_problem("softmax")
    plain = compiled((HOSTILE / "raw.h").read_text().replace("static void softmax_rows", "void softmax"), cache)
    lease, contender = started_contender(problem, plain, 1, cache)
    try:
        groups = plan_trials(problem, "validation", 1, 0)[:1]
        runner = TrialRunner(problem, contender, CALL_TIMEOUT_S)
        assert runner.run(groups) is None
        assert contender.worker_pid is not None
        contender.pause()
        worker = psutil.Process(contender.worker_pid)
        deadline = time.monotonic() + 5
        while worker.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.status() == psutil.STATUS_STOPPED
        assert runner.run(groups) is None  # resumed for its next command
        assert worker.status() != psutil.STATUS_STOPPED
        contender.close()
    finally:
        contender.discard()
        lease.release()


@x86_64
def test_a_worker_gone_right_after_its_bye_finished_as_told(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker leaves with os._exit right after Bye, so the parent may find it gone when it looks: that is
    the end it was told to make, not a death to judge."""
    problem = load_problem("softmax")
    plain = compiled((HOSTILE / "raw.h").read_text().replace("static void softmax_rows", "void softmax"), cache)
    lease, contender = started_contender(problem, plain, 1, cache)
    try:
        groups = plan_trials(problem, "validation", 1, 0)[:1]
        assert TrialRunner(problem, contender, CALL_TIMEOUT_S).run(groups) is None

        def gone(pid: int) -> psutil.Process:
            raise psutil.NoSuchProcess(pid)

        # As if the worker had exited before the parent looked at it after Bye.
        monkeypatch.setattr("engine.harness.driver.psutil.Process", gone)
        outcome = contender.close()
        assert outcome.exit_code == 0, outcome
    finally:
        contender.discard()
        lease.release()
