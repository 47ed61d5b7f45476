"""The outcomes of judging a candidate kernel: compile, validation and benchmark reports, and their verdict.

These are pydantic models because they cross process and Temporal boundaries and are stored as event
payloads; they hold evidence (first compiler error, failing case, per-shape timings), never bulk data.

A verdict names what happened, from the candidate's point of view:

- ``ok``: compiled, correct on every trial, and (for a benchmark) timed with a confidence interval.
- ``compile_error``: the source did not compile or link, lacks the entry point or has the wrong signature.
- ``incorrect``: an output differed from the float64 reference beyond tolerance, stayed NaN, a guard
  byte around a buffer changed, or an input was modified.
- ``crash``: the process died from a signal (the signal number is recorded) or exited during a call.
- ``timeout``: a call ran past its wall-clock limit or the process ran out of CPU time.
- ``resource_limit``: memory beyond the address-space limit, forked processes or threads left running
  after a call returned, or a CPU affinity changed by the candidate.
- ``forbidden``: the built library or the running candidate did something no kernel may: a constructor,
  destructor or load-time resolver, an undefined symbol outside the allow-list (file, process, network or
  clock functions…), or a system call the sandbox's seccomp filter refuses. The evidence names the symbol,
  section or system call.
- ``harness_error``: the judge itself failed (the sandbox could not start, the child reported nothing that
  the kernel can be shown to have caused): not the kernel's verdict, never counted or reused as one.
- ``impossible``: measured faster than the roofline bound of this machine allows (bytes moved / measured
  bandwidth, flops / measured peak, with a generous safety factor), or much faster in the timed rounds than on
  inputs no call had read (check ``fresh_inputs``: it reused earlier calls' work): the timing cannot be trusted.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from engine.hardware import HardwareFingerprint
from engine.harness.contention import busy
from engine.harness.cuda.ptxas import PtxasReport
from engine.harness.screen import ScreenViolation


class Verdict(StrEnum):
    """What happened to a candidate; see the module docstring for each value's meaning."""

    ok = "ok"
    compile_error = "compile_error"
    incorrect = "incorrect"
    crash = "crash"
    timeout = "timeout"
    resource_limit = "resource_limit"
    impossible = "impossible"
    forbidden = "forbidden"
    harness_error = "harness_error"


class CompileResult(BaseModel):
    """The outcome of compiling one source with one set of flags into a shared library."""

    verdict: Verdict = Field(
        description=(
            "ok, compile_error, or forbidden when the built library failed the screen (see screen); harness_error "
            "when the compiler's sandbox failed or the compiler was killed from outside (never cached)."
        )
    )
    artifact_id: str | None = Field(
        default=None,
        description="Content hash of source, flags, compiler version, target and ABI; None on failure.",
    )
    error_category: str | None = Field(
        default=None,
        description=(
            "Why it failed: syntax, undeclared, type, wrong_signature, missing_entry, disallowed_flag, include "
            "(a refused or missing #include), linker, timeout, compiler_crash, no_compiler, other, or "
            "forbidden_<kind> (forbidden_constructor, forbidden_symbol…: the screen's first violation). CUDA "
            "also: launch_spec (a missing or malformed `// kf-launch:` line), launch_limit (a shape's launch "
            "beyond the architecture's limits, named in first_error) and ptxas (ptxas refused the code)."
        ),
    )
    first_error: str | None = Field(default=None, description="The first error line, or the harness's message.")
    log: str = Field(default="", description="Compiler output, truncated to a few KiB.")
    screen: list[ScreenViolation] = Field(
        default_factory=list,
        description="What the screen of the built library found (engine.harness.screen); empty unless forbidden.",
    )
    flags: list[str] = Field(default_factory=list, description="The candidate's flags, as given and allowed.")
    compiler: str = Field(default="", description="Compiler version line.")
    target: str = Field(default="", description="Target the artifact was built for (cpu-…, cuda-sm90…).")
    cached: bool = Field(default=False, description="True when the result came from the artifact cache.")
    seconds: float = Field(default=0.0, description="Wall-clock seconds spent (0 for a cache hit).")
    ptxas: PtxasReport | None = Field(
        default=None,
        description=(
            "CUDA: ptxas's report of the entry (registers, spills, shared memory, stack) when it compiled; "
            "None for CPU builds and for sources that did not reach ptxas."
        ),
    )


class CaseEvidence(BaseModel):
    """One failing trial: enough to reproduce it (shape, seed, distribution) and to see how it failed."""

    phase: str = Field(description="validation, revalidation (after benchmarking) or benchmark.")
    check: str = Field(
        description=(
            "What failed: output, guard_before, guard_after, input_modified, threads, processes, affinity, "
            "signal, memory, timeout, exit, load, timed_output, fresh_inputs or harness."
        )
    )
    shape: dict[str, int] = Field(default_factory=dict, description="Problem sizes of the trial.")
    seed: int | None = Field(default=None, description="Seed of the trial's inputs (Problem.make_inputs).")
    distribution: str | None = Field(default=None, description="Input distribution of the trial.")
    output: str | None = Field(default=None, description="The parameter (buffer) concerned.")
    max_abs_err: float | None = Field(default=None, description="Largest |candidate - reference|.")
    max_rel_err: float | None = Field(default=None, description="Largest |candidate - reference| / |reference|.")
    worst_index: list[int] | None = Field(
        default=None, description="Index of the element furthest outside tolerance (or first bad byte)."
    )
    expected: float | None = Field(default=None, description="Reference value at worst_index.")
    got: float | None = Field(default=None, description="Candidate value at worst_index.")
    message: str = Field(description="One readable line saying what went wrong.")


class ValidationReport(BaseModel):
    """Correctness of a compiled candidate over shapes × seeds × distributions, judged by the parent."""

    verdict: Verdict = Field(description="ok, incorrect, crash, timeout or resource_limit.")
    trials: int = Field(default=0, description="Calls whose outputs, guards and inputs were checked.")
    cases: list[CaseEvidence] = Field(default_factory=list, description="Evidence of the failing trial(s).")
    signal: int | None = Field(default=None, description="Signal that killed the candidate, if any.")
    message: str = Field(default="", description="One-line summary of the outcome.")
    output_tail: str = Field(default="", description="Last bytes the candidate printed to stdout/stderr.")
    isolation: str = Field(default="", description="Sandbox isolation used (namespaces or process-group).")
    seconds: float = Field(default=0.0, description="Wall-clock seconds spent.")


class ShapeTiming(BaseModel):
    """Paired timings of the candidate and one reference point on one benchmark shape."""

    shape: dict[str, int] = Field(description="Problem sizes.")
    weight: float = Field(description="Weight of this shape in the geometric mean.")
    candidate_ns: float = Field(description="Median candidate time per call, nanoseconds.")
    reference_ns: float = Field(description="Median reference time per call, nanoseconds.")
    ratio: float = Field(description="Median over rounds of reference_ns / candidate_ns (>1: candidate faster).")
    ci_low: float = Field(description="Lower end of the bootstrap interval of ratio at the report's `confidence`.")
    ci_high: float = Field(description="Upper end of the bootstrap interval of ratio at the report's `confidence`.")
    samples: int = Field(description="Paired rounds timed.")
    roofline_ns: float | None = Field(
        default=None, description="Physical lower bound of one call on this machine, nanoseconds."
    )
    roofline_gbs: float | None = Field(
        default=None,
        description=(
            "The bandwidth roofline_ns divides the shape's bytes by (GB/s, all threads): the measured streaming "
            "bandwidth when the shape's input pool streams from memory, the cache's when it fits in cache."
        ),
    )


LEGACY_METHOD = 1
"""The measurement method of every benchmark report recorded before reports said which they were."""

CPU_MEASUREMENT_METHOD = 2
"""Version of how the CPU judge takes a reading. Bump it with any change to the harness that can move a
kernel's reading (where inputs and outputs lie, how contenders are interleaved, what a timed call covers):
readings of different methods are not comparable, so the lessons keep a setting's readings of the newest
method only (engine/evidence/lessons_projection.py) and a warm search re-measures a setting that only an
older method has settled (engine/proposers/setting_evidence.py settled_candidates).

1. Reports recorded before the field existed. Outputs came from malloc: the first benchmark shape's were
   mmapped 64 bytes into a page, 4K-aliased with the page-aligned inputs, which slowed streaming stores there.
2. Each output in an anonymous mapping of its own, at offsets spread over the page (engine/harness/worker.py
   output_offsets)."""

CUDA_MEASUREMENT_METHOD = 1
"""The same for the CUDA judge (engine/harness/cuda/judge.py): unchanged since its first reading."""


def measurement_method(target: str) -> int:
    """The method a reading on ``target`` (``cpu-…`` or ``cuda-sm…``) is taken with today."""
    return CUDA_MEASUREMENT_METHOD if target.startswith("cuda") else CPU_MEASUREMENT_METHOD


class BenchmarkReport(BaseModel):
    """The candidate against one reference point, timed interleaved in one sandboxed process."""

    verdict: Verdict = Field(description="ok, or why the timings do not count (incorrect, impossible, …).")
    reference: str = Field(description="Label of the reference point, e.g. numpy, seed, incumbent.")
    speedup: float = Field(
        description="Weighted geometric mean over shapes of reference_time / candidate_time (>1: faster)."
    )
    ci_low: float = Field(description="Lower end of the joint bootstrap interval of speedup at `confidence`.")
    ci_high: float = Field(description="Upper end of the joint bootstrap interval of speedup at `confidence`.")
    confidence: float = Field(
        default=0.95,
        description=(
            "Confidence level of ci_low/ci_high and of every shape's interval (0.95: a 95% interval); the "
            "search's is its promotion policy's. Reports recorded before the field existed were at 0.95."
        ),
    )
    shapes: list[ShapeTiming] = Field(default_factory=list, description="Per-shape timings.")
    threads: int = Field(default=1, description="Cores the candidate and the reference were pinned to.")
    cpus_exclusive: bool = Field(
        default=True, description="False when another sandbox on this machine shared those cores during timing."
    )
    foreign_cpu_share: float | None = Field(
        default=None,
        description=(
            "Share of those cores' time, while shapes were timed, that went to work outside the benchmark (other "
            "processes, the hypervisor's steal; engine/harness/contention.py); above FOREIGN_SHARE_BUSY the machine "
            "was busy. None where it could not be read, and in reports recorded before the field existed."
        ),
    )
    revalidated: bool = Field(
        default=False, description="True when the candidate passed validation again after being timed."
    )
    cases: list[CaseEvidence] = Field(default_factory=list, description="Evidence when verdict is not ok.")
    message: str = Field(default="", description="One-line summary.")
    hardware: HardwareFingerprint = Field(description="Machine, compiler and cores of the measurement.")
    method: int = Field(
        default=LEGACY_METHOD,
        description=(
            "How the judge took the reading: CPU_MEASUREMENT_METHOD or CUDA_MEASUREMENT_METHOD of the code that "
            "timed it. Readings of different methods are not comparable; reports recorded before the field "
            "existed read as LEGACY_METHOD."
        ),
    )
    timed_seconds: float = Field(
        default=0.0, description="Seconds inside timed calls, all contenders, timed rounds only (not warm-up)."
    )
    handshake_share: float = Field(
        default=0.0,
        description=(
            "The parent's pipe handshake (Go to Done with no calls) over the median timed batch, worst shape: "
            "how much of each timed batch is not the kernel's."
        ),
    )
    seconds: float = Field(default=0.0, description="Wall-clock seconds spent (shared by all references).")
    roofline_fraction: float | None = Field(
        default=None,
        description=(
            "How close the candidate came to the physical bound: the weighted geometric mean over shapes of "
            "roofline_ns / candidate_ns (1.0 is at the bound). On a GPU the bound is bytes moved / the measured "
            "HBM bandwidth, so this is the HBM roofline fraction; None where no bound was computed."
        ),
    )

    @property
    def shared_cores(self) -> bool:
        """The timing shared its cores: with another sandbox of this machine's (the lease was not exclusive), or
        with work from outside the benchmark (a busy machine, see engine/harness/contention.py)."""
        return not self.cpus_exclusive or busy(self.foreign_cpu_share)


class Evaluation(BaseModel):
    """Compile, validate and benchmark one candidate source: the answer of ``kf evaluate``."""

    verdict: Verdict = Field(description="The first verdict that was not ok, else ok.")
    problem: str = Field(default="", description="Problem name.")
    compile: CompileResult = Field(description="Compile outcome.")
    validation: ValidationReport | None = Field(default=None, description="None when it did not compile.")
    benchmark: BenchmarkReport | None = Field(default=None, description="None unless validation passed.")
    speedup: float | None = Field(default=None, description="benchmark.speedup, for convenience.")
    ci_low: float | None = Field(default=None, description="benchmark.ci_low, for convenience.")
    ci_high: float | None = Field(default=None, description="benchmark.ci_high, for convenience.")
    evidence: list[str] = Field(default_factory=list, description="Readable lines explaining the verdict.")
