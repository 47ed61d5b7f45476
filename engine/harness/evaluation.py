"""Evaluate a candidate kernel: compile, validate, benchmark -- the public surface of the harness.

The workflow's activities call the three steps separately (each on its own queue, each recorded as an
event); ``kf evaluate`` and tests call :func:`evaluate`, which chains them and stops at the first verdict
that is not ok. Each step goes through the target's backend (engine.harness.backend); on a CPU::

    compile_source(problem, source, flags)            -> CompileResult      (engine.harness.cpu)
    validate_artifact(problem, artifact_id, ...)      -> ValidationReport   (engine.harness.validation)
    benchmark_artifact(problem, artifact_id, refs...) -> [BenchmarkReport]  (engine.harness.benchmarking)

and on a GPU (``cuda-sm90``…) ``compile_cuda`` (engine.harness.cuda.compile) and the GPU judge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import UserError
from engine.harness.backend import Backend, backend_for
from engine.harness.benchmarking import DEFAULT_BUDGET_S, Reference, benchmark_artifact
from engine.harness.contention import busy_reason
from engine.harness.validation import validate_artifact
from engine.harness.verdicts import (
    BenchmarkReport,
    CaseEvidence,
    CompileResult,
    Evaluation,
    ValidationReport,
    Verdict,
)
from engine.problems import Problem, load_problem

__all__ = [
    "BenchmarkReport",
    "CompileResult",
    "Evaluation",
    "Reference",
    "ValidationReport",
    "Verdict",
    "benchmark_artifact",
    "evaluate",
    "resolve_baseline",
    "validate_artifact",
]

BASELINE_CHOICES = ("reference", "numpy", "seed")


def resolve_baseline(
    problem: Problem, baseline: str, *, cache_dir: Path | None = None, backend: Backend | None = None
) -> Reference:
    """The reference point named by ``baseline``: ``reference`` (or ``numpy``) for the problem's library
    baseline (numpy; on a GPU its CuPy ``cuda_baseline``), ``seed`` for its naive seed kernel, or the path of a
    source file (compiled with the backend's default flags). ``backend``: the CPU's unless given."""
    backend = backend or backend_for("cpu")
    problem = backend.problem(problem)
    if baseline in ("reference", "numpy"):
        return backend.library_reference
    if baseline == "seed":
        source, label = problem.seed_source(), "seed"
    else:
        path = Path(baseline).expanduser()
        if not path.is_file():
            raise UserError(
                f"--baseline {baseline!r} is neither one of {list(BASELINE_CHOICES)} nor a C source file; "
                "pass reference, seed or the path of a .c file"
            )
        source, label = path.read_text(), path.name
    compiled = backend.compile(problem, source, None, cache_dir=cache_dir)
    if compiled.verdict != Verdict.ok or compiled.artifact_id is None:
        raise UserError(f"baseline {label!r} does not compile ({compiled.error_category}): {compiled.first_error}")
    return Reference(kind="artifact", artifact_id=compiled.artifact_id, label=label)


def evaluate(
    problem: Problem | str,
    source: str,
    flags: Sequence[str] | str | None = None,
    baseline: str = "reference",
    *,
    threads: int = 1,
    budget_s: float = DEFAULT_BUDGET_S,
    seeds: int = 3,
    seed: int = 0,
    cache_dir: Path | None = None,
    isolation: str = "auto",
    target: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Compile, validate and benchmark ``source`` against ``baseline`` on ``target`` (``cpu``, ``cuda-sm90``…);
    see :func:`resolve_baseline`. ``progress`` is told each step as it starts (``kf evaluate`` shows it)."""
    say = progress or (lambda step: None)
    if isinstance(problem, str):
        problem = load_problem(problem)
    backend = backend_for(target)
    problem = backend.problem(problem)
    if baseline not in ("reference", "numpy"):
        say(f"compiling the baseline ({baseline})")
    reference = resolve_baseline(problem, baseline, cache_dir=cache_dir, backend=backend)
    say("compiling")
    compiled = backend.compile(problem, source, flags, cache_dir=cache_dir)
    result = Evaluation(verdict=compiled.verdict, problem=problem.name, compile=compiled)
    if compiled.verdict != Verdict.ok or compiled.artifact_id is None:
        return _with_evidence(result)
    say("validating")
    validation = backend.validate(
        problem,
        compiled.artifact_id,
        seeds=seeds,
        seed=seed,
        threads=threads,
        cache_dir=cache_dir,
        isolation=isolation,
    )
    result = result.model_copy(update={"verdict": validation.verdict, "validation": validation})
    if validation.verdict != Verdict.ok:
        return _with_evidence(result)
    # The first timing on a machine also measures it (bandwidth, peak, noise floor: about a minute), once.
    say(f"benchmarking against {reference.label}")
    (report,) = backend.benchmark(
        problem,
        compiled.artifact_id,
        [reference],
        budget_s=budget_s,
        threads=threads,
        seed=seed,
        cache_dir=cache_dir,
        isolation=isolation,
    )
    result = result.model_copy(
        update={
            "verdict": report.verdict,
            "benchmark": report,
            "speedup": report.speedup if report.verdict == Verdict.ok else None,
            "ci_low": report.ci_low if report.verdict == Verdict.ok else None,
            "ci_high": report.ci_high if report.verdict == Verdict.ok else None,
        }
    )
    return _with_evidence(result)


def _case_lines(case: CaseEvidence) -> list[str]:
    lines = [f"{case.phase}: {case.message}"]
    if case.shape:
        where = f"shape {case.shape}"
        if case.distribution is not None:
            where += f", distribution {case.distribution!r}, seed {case.seed}"
        lines.append(f"  trial: {where} (check: {case.check})")
    return lines


def _with_evidence(result: Evaluation) -> Evaluation:
    """Readable lines saying why the verdict is what it is."""
    lines: list[str] = []
    compiled = result.compile
    if compiled.verdict != Verdict.ok:
        lines.append(f"compile error ({compiled.error_category}): {compiled.first_error}")
        lines += [f"  {line}" for line in compiled.log.splitlines()[:8]]
    validation = result.validation
    if validation is not None:
        if validation.verdict == Verdict.ok:
            lines.append(f"validation: {validation.trials} trials passed ({validation.isolation} sandbox)")
        else:
            for case in validation.cases:
                lines += _case_lines(case)
            if validation.signal is not None:
                lines.append(f"  signal: {validation.signal}")
            if validation.output_tail.strip():
                lines.append(f"  candidate output: {validation.output_tail.strip()[-300:]}")
    report = result.benchmark
    if report is not None:
        if report.verdict == Verdict.ok:
            lines.append(
                f"benchmark: {report.speedup:.3f}x vs {report.reference} "
                f"[{report.ci_low:.3f}, {report.ci_high:.3f}] ({report.confidence:.0%} CI), "
                f"{report.threads} thread(s), revalidated after timing: {report.revalidated}"
            )
            if report.shared_cores:
                reason = busy_reason(report.cpus_exclusive, report.foreign_cpu_share)
                lines.append(f"  busy machine: {reason}; time it again when the machine is quieter")
        else:
            lines.append(f"benchmark: {report.message}")
            for case in report.cases:
                lines += _case_lines(case)
    return result.model_copy(update={"evidence": lines})
