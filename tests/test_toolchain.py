"""A compile the machine failed is a harness_error, never the kernel's compile_error: a full scratch disk and a
toolchain that fails on every source (engine/harness/toolchain.py). A kernel cannot pass its own error off as
the machine's by what it makes the compiler print. A compile stopped at its wall-clock limit is the source's
timeout only when the compiler was working on it; one the machine kept from running is the machine's."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loaded_machine import descendants_named, slowed

from engine.harness import compile_patience, cpu, sandbox, toolchain
from engine.harness.cpu import compile_source
from engine.harness.verdicts import Verdict
from engine.problems import load_problem
from engine.proposers.random_template import template_space

SYNTAX_ERROR = "#include <stdint.h>\nvoid softmax(const float *x, float *y, int64_t rows, int64_t cols) { y[0] = ; }\n"


def cached_errors(cache: Path) -> list[Path]:
    """The compile errors cached for reuse (a verdict is; the machine's failure never is)."""
    return list((cache / "compile-errors").glob("*.json"))


@pytest.fixture
def small_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An 80 MiB tmpfs the sandboxes make their scratch folders on (root only: it is mounted)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    mount_point = Path(tempfile.mkdtemp(prefix="kf-small-disk-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=80m,mode=1777", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    monkeypatch.setattr(sandbox, "_scratch_base", lambda: str(mount_point))
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        mount_point.rmdir()


def fill(disk: Path) -> Path:
    """A file that takes every free byte of ``disk``."""
    filler = disk / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):  # unbuffered: the last short write ends at the disk's last byte
            try:
                while os.write(descriptor, b"\0" * size):
                    pass
            except OSError:
                continue
    finally:
        os.close(descriptor)
    return filler


def test_a_compile_on_a_full_scratch_disk_is_the_machines_failure(small_disk: Path, tmp_path: Path) -> None:
    problem = load_problem("softmax")
    filler = fill(small_disk)
    assert shutil.disk_usage(small_disk).free < 64 << 10
    # Full to the last byte (the source cannot be written), then with room for the source but not the compiler's
    # output (the compiler fails, with no message: even its log cannot be written).
    for room in (0, 16 << 10):
        os.truncate(filler, filler.stat().st_size - room)
        full = compile_source(problem, problem.seed_source(), cache_dir=tmp_path)
        assert full.verdict == Verdict.harness_error, (room, full.error_category, full.first_error)
        assert full.first_error and full.first_error.startswith("the scratch disk is full"), full.first_error
        assert cached_errors(tmp_path) == [] and full.artifact_id is None
    # Room again: the same source compiles, and a kernel's own error is its verdict again (and cached).
    filler.unlink()
    assert compile_source(problem, problem.seed_source(), cache_dir=tmp_path).verdict == Verdict.ok
    own = compile_source(problem, SYNTAX_ERROR, cache_dir=tmp_path)
    assert own.verdict == Verdict.compile_error and own.error_category == "syntax", own.first_error
    assert len(cached_errors(tmp_path)) == 1


def test_a_kernel_cannot_fill_the_disk_itself_to_pass_its_error_off(small_disk: Path, tmp_path: Path) -> None:
    # A 24 MB assembly file on the 80 MiB disk, then an assembler error: measured with its own file still there
    # the disk would read under 64 MiB free, the machine's failure; without it, the kernel's compile_error.
    source = (
        "#include <stdint.h>\n"
        "const unsigned char kf_big[5000000] = {[0 ... 4999999] = 1};\n"
        '__asm__(".error \\"refused\\"");\n'
        "void softmax(const float *x, float *y, int64_t rows, int64_t cols) { }\n"
    )
    result = compile_source(load_problem("softmax"), source, cache_dir=tmp_path)
    assert result.verdict == Verdict.compile_error, (result.error_category, result.first_error)
    assert "refused" in (result.first_error or "")


def test_a_nearly_full_scratch_disk_makes_a_failed_compile_the_machines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The disk's free space, read after the compile failed, below the mark: the machine's (no root needed).
    monkeypatch.setattr(toolchain, "MIN_SCRATCH_FREE", 1 << 62)
    failed = compile_source(load_problem("softmax"), SYNTAX_ERROR, cache_dir=tmp_path)
    assert failed.verdict == Verdict.harness_error and "scratch disk is full" in (failed.first_error or "")
    assert "expected expression" in (failed.first_error or "")  # what the compiler said is kept
    assert cached_errors(tmp_path) == []
    # A successful compile is not held up by the check: it runs only when a compile failed.
    seed = load_problem("softmax").seed_source()
    assert compile_source(load_problem("softmax"), seed, cache_dir=tmp_path).verdict == Verdict.ok


def wrapped_compiler(monkeypatch: pytest.MonkeyPatch, prelude: str) -> Iterator[Path]:
    """CC pointing at a shell script that runs ``prelude`` and then the real compiler, in a folder the sandbox's
    unprivileged user can run it from."""
    folder = Path(tempfile.mkdtemp(prefix="kf-wrapped-cc-"))
    folder.chmod(0o755)
    wrapper = folder / "cc"
    real = shutil.which("cc") or shutil.which("gcc")
    assert real is not None
    wrapper.write_text(f'#!/bin/sh\n{prelude}exec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    try:
        yield wrapper
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def broken_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """CC pointing at a compiler that answers --version but fails every build, as one whose cc1 or assembler is
    gone does."""
    yield from wrapped_compiler(
        monkeypatch,
        'for arg in "$@"; do\n'
        '  if [ "$arg" = "-o" ]; then\n'
        "    echo \"cc: fatal error: cannot execute 'cc1': execvp: No such file or directory\" >&2\n"
        "    exit 1\n"
        "  fi\n"
        "done\n",
    )


def test_a_compiler_that_fails_on_every_source_is_the_machines_failure(broken_compiler: Path, tmp_path: Path) -> None:
    problem = load_problem("softmax")
    broken = compile_source(problem, problem.seed_source(), cache_dir=tmp_path)
    assert broken.verdict == Verdict.harness_error, (broken.error_category, broken.first_error)
    assert "fails on a known-good source too" in (broken.first_error or ""), broken.first_error
    assert "cannot execute 'cc1'" in (broken.first_error or "")
    assert cached_errors(tmp_path) == []


@pytest.mark.parametrize(
    "source",
    [
        # #line names the file of the diagnostics: the error reads as the compiler driver's own
        '#line 1 "cc1: fatal error: error writing to kernel.s"\n#error No space left on device\n',
        # the assembler's .print writes any line; .error then fails the assembly
        "#include <stdint.h>\n"
        'asm(".print \\"cc1: fatal error: cannot execute as: No space left on device\\"\\n.error \\"x\\"");\n'
        "void softmax(const float *x, float *y, int64_t rows, int64_t cols) { }\n",
    ],
    ids=["line-directive", "assembler-print"],
)
def test_a_kernel_cannot_pass_its_own_error_off_as_the_machines(source: str, tmp_path: Path) -> None:
    result = compile_source(load_problem("softmax"), source, cache_dir=tmp_path)
    assert result.verdict == Verdict.compile_error, (result.error_category, result.first_error)
    assert "No space left on device" in (result.log or "")
    assert len(cached_errors(tmp_path)) == 1


@pytest.fixture
def short_compile_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 s wall-clock limit for each compiler run, of which a quarter on a CPU makes a stop the source's: enough
    on a busy two-core machine for a compiler that works the whole time, and far above one that never runs."""
    monkeypatch.setattr(cpu, "COMPILE_LIMITS", dataclasses.replace(cpu.COMPILE_LIMITS, wall_seconds=2.0))
    monkeypatch.setattr(cpu, "COMPILE_HAD_ITS_CPU", 0.25)


@pytest.fixture
def stalled_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """CC pointing at a compiler that waits without running (as one on a paused machine, or kept off every CPU,
    does) before it compiles."""
    yield from wrapped_compiler(monkeypatch, 'case "$*" in *--version*) ;; *) sleep 30 ;; esac\n')


@pytest.mark.usefixtures("short_compile_limit", "stalled_compiler")
def test_a_compile_the_machine_held_past_its_limit_is_the_machines_failure(tmp_path: Path) -> None:
    problem = load_problem("softmax")
    held = compile_source(problem, problem.seed_source(), cache_dir=tmp_path)
    assert held.verdict == Verdict.harness_error, (held.error_category, held.first_error)
    assert "held it back" in (held.first_error or ""), held.first_error
    assert cached_errors(tmp_path) == []


@pytest.mark.usefixtures("short_compile_limit")
def test_a_source_that_keeps_the_compiler_busy_past_its_limit_is_its_timeout(tmp_path: Path) -> None:
    # A preprocessor bomb: 2^40 expansions of one token, CPU work for the compiler from start to end.
    bomb = "".join(f"#define A{i + 1} A{i} A{i}\n" for i in range(40))
    source = f"#define A0 x\n{bomb}int kf_bomb = A40;\n"
    result = compile_source(load_problem("softmax"), source, cache_dir=tmp_path)
    assert result.verdict == Verdict.compile_error, (result.error_category, result.first_error)
    assert result.error_category == "timeout", result.first_error
    assert len(cached_errors(tmp_path)) == 1


COMPILER_PROCESSES = {"cc1", "cc1plus", "as", "ld", "collect2"}


@pytest.fixture
def loaded_machine() -> Iterator[None]:
    """This process's compiler processes get a tenth of a CPU, as on a machine loaded ten times over."""
    with slowed(descendants_named(COMPILER_PROCESSES), share=0.1):
        yield


@pytest.mark.usefixtures("short_compile_limit", "loaded_machine")
def test_a_compile_a_loaded_machine_slows_past_its_limit_gets_the_time_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A template setting's compile takes 0.5-0.8 s of CPU here: at a tenth of a CPU, 5-8 s, past the 2 s limit,
    # and short of the two seconds of CPU (the whole limit) that would make it the source's timeout. The stretch
    # is raised to eight limits: under CI's own load the throttled compiler gets less than its tenth (it once had
    # only 0.6 s of CPU when four limits ran out), and this test is about the stretch happening, not its length.
    monkeypatch.setattr(cpu, "COMPILE_HAD_ITS_CPU", 1.0)
    monkeypatch.setattr(compile_patience, "STRETCH", 8.0)
    problem = load_problem("softmax")
    source = problem.render_template(template_space(problem)[-1])
    started = time.monotonic()
    result = compile_source(problem, source, cache_dir=tmp_path)
    seconds = time.monotonic() - started
    assert result.verdict == Verdict.ok, (result.error_category, result.first_error)
    assert seconds > cpu.COMPILE_LIMITS.wall_seconds, f"the throttle did not slow the compile ({seconds:.1f} s)"


@pytest.mark.usefixtures("short_compile_limit")
def test_a_source_that_keeps_a_slowed_compiler_busy_is_still_its_timeout_not_the_machines(tmp_path: Path) -> None:
    # A fifth of a CPU: the bomb reaches the 2 s limit with about 0.4 s on a CPU, short of the half second (a
    # quarter of the limit) that makes the stop the source's, which it has about half a second later. Before, it
    # was held at the limit and retried as the machine's. (A fifth rather than a tenth: on a busy two-core machine
    # the compiler gets less than its share, and it must get its half second within four limits.)
    bomb = "".join(f"#define A{i + 1} A{i} A{i}\n" for i in range(40))
    source = f"#define A0 x\n{bomb}int kf_bomb = A40;\n"
    with slowed(descendants_named(COMPILER_PROCESSES), share=0.2):
        result = compile_source(load_problem("softmax"), source, cache_dir=tmp_path)
    assert result.verdict == Verdict.compile_error, (result.error_category, result.first_error)
    assert result.error_category == "timeout", result.first_error
    assert "kept a CPU busy" in (result.first_error or ""), result.first_error
    assert len(cached_errors(tmp_path)) == 1


def test_the_patience_rule_stretches_a_running_compile_and_stops_a_stalled_or_endless_one() -> None:
    def reading(value: float | None) -> Callable[[], float | None]:
        return lambda: value

    def never() -> float | None:
        raise AssertionError("the CPU time is read only past the limit")

    assert compile_patience.CompilePatience(10).decide(9.9, never) is None
    assert compile_patience.CompilePatience(10).decide(10, reading(5.0)) == "timeout"  # it had its CPU
    assert compile_patience.CompilePatience(10).decide(10, reading(None)) == "timeout"  # cannot be told: as before
    stalled = compile_patience.CompilePatience(10)
    assert stalled.decide(10, reading(1.0)) is None
    assert stalled.decide(11, reading(1.0)) is None  # no CPU for 1 s: within the 2.5 s a stall is given
    assert stalled.decide(12.5, reading(1.0)) == "held" and "held it back" in stalled.reason()
    slowed = compile_patience.CompilePatience(10)
    elapsed, cpu_s = 10.0, 1.0
    while slowed.decide(elapsed, reading(cpu_s)) is None and elapsed < 100:
        elapsed, cpu_s = elapsed + 1, cpu_s + 0.1  # a tenth of a CPU: running, never its share
    assert (slowed.stop, elapsed) == ("held", slowed.longest_s)
    working = compile_patience.CompilePatience(10)
    elapsed, cpu_s = 10.0, 1.0
    while working.decide(elapsed, reading(cpu_s)) is None and elapsed < 100:
        elapsed, cpu_s = elapsed + 1, cpu_s + 0.5  # half a CPU: its share of the limit in 8 more seconds
    assert (working.stop, elapsed) == ("timeout", 18.0) and "kept a CPU busy" in working.reason()
    # A short limit: a quarter of it would be one reading, and a compile at a tenth of a CPU can gain no clock tick
    # between two; it is held only after STALL_READINGS readings without CPU time.
    short = compile_patience.CompilePatience(2)
    assert short.decide(2, reading(0.1)) is None
    assert short.decide(2.5, reading(0.1)) is None and short.decide(3.0, reading(0.1)) is None
    assert short.decide(3.5, reading(0.1)) == "held"
