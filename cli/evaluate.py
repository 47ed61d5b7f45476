"""``kf evaluate``: compile, validate and benchmark one kernel source, and say what it is worth.

    kf evaluate --problem softmax --source my.c [--flags "-O3 -march=native"] [--baseline reference|seed|FILE]
                [--threads N] [--budget SECONDS] [--json]
    kf evaluate --problem softmax --source my.cu --target cuda-sm90

Exit status 0 only when the verdict is ok; 1 for any other verdict of the kernel; 2 for bad input; 3 when
the machine failed, not the kernel (verdict harness_error, a sandbox that could not start, a calibration
that failed); 143 when terminated (SIGTERM), after its sandboxes are killed and their folders removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cli import exit_status
from cli.options import integer, number, problem_name
from cli.progress import StepProgress
from engine.errors import UserError
from engine.harness.benchmarking import DEFAULT_BUDGET_S
from engine.harness.cpu import DEFAULT_FLAGS, normalize_flags
from engine.harness.driver import SandboxFailure
from engine.harness.evaluation import BASELINE_CHOICES, evaluate
from engine.harness.machine import CalibrationFailed
from engine.harness.verdicts import Evaluation, Verdict
from engine.input_errors import allowed, explain
from engine.problems import load_problem
from engine.search.spec import MAX_BENCHMARK_SECONDS, MAX_FLAG_CHARS, MAX_FLAGS, MAX_THREADS, CompilerFlags

EXIT_TERMINATED = exit_status.TERMINATED
EXIT_MACHINE = exit_status.MACHINE
MAX_SOURCE_BYTES = 1 << 20
"""Largest kernel source `kf evaluate` reads: a C file, not a data dump."""
MAX_VALIDATION_SEEDS = 100
"""Most validation seeds per shape and distribution (each is a full set of trials)."""


class EvaluationRequest(BaseModel):
    """The measuring options of `kf evaluate`, bounded like the same fields of a search (engine/search/spec.py)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    flags: CompilerFlags | None = None
    """Compiler flags; `None` uses the backend's defaults."""
    threads: int = Field(default=1, ge=1, le=MAX_THREADS, strict=True)
    """Cores the kernel may use; also at most the CPUs this process may use (checked against the machine)."""
    budget: float = Field(default=DEFAULT_BUDGET_S, gt=0, le=MAX_BENCHMARK_SECONDS, strict=True)
    """Seconds of timing across the benchmark shapes."""
    seeds: int = Field(default=3, ge=1, le=MAX_VALIDATION_SEEDS, strict=True)
    """Validation seeds per shape and distribution."""


OPTION_OF = {"flags": "--flags", "threads": "--threads", "budget": "--budget", "seeds": "--seeds"}
"""The option that sets each EvaluationRequest field, for error messages."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="compile, validate and benchmark a kernel source",
        description=(
            "Compile a C kernel for a problem, validate it on fresh inputs in a sandbox, and time it against "
            "a baseline, interleaved, with a 95% confidence interval. Exit status 0 only for verdict ok; 1 for "
            f"any other verdict; 2 for bad input; {EXIT_MACHINE} when the machine failed, not the kernel; "
            f"{EXIT_TERMINATED} when terminated (SIGTERM), after its sandboxes are cleaned up."
        ),
    )
    parser.add_argument(
        "--problem", required=True, type=problem_name, help="a built-in problem name or a problem folder"
    )
    parser.add_argument(
        "--source",
        required=True,
        help=f"the C source file of the kernel ('-' reads stdin): UTF-8 text of at most {MAX_SOURCE_BYTES} bytes",
    )
    parser.add_argument(
        "--flags",
        default=None,
        help=f"compiler flags in one string, quoted like a shell's (default: {shlex.join(DEFAULT_FLAGS)!r}; "
        f"at most {MAX_FLAGS} flags of at most {MAX_FLAG_CHARS} characters each)",
    )
    parser.add_argument(
        "--target",
        default="cpu",
        help="where the kernel runs: cpu (this machine's CPU, the default; the source is C) or cuda-sm<NN> such as "
        "cuda-sm90 (the source is CUDA, built with NVRTC, judged on this machine's GPU)",
    )
    parser.add_argument(
        "--baseline",
        default="reference",
        help="reference (numpy, the default), seed (the problem's naive kernel) or a C file",
    )
    parser.add_argument(
        "--threads",
        type=integer(EvaluationRequest, "threads"),
        default=1,
        help=f"cores the kernel may use (default 1; {allowed(EvaluationRequest, 'threads')}, and at most the "
        f"{_usable_cpus()} CPUs this process may use)",
    )
    parser.add_argument(
        "--budget",
        type=number(EvaluationRequest, "budget"),
        default=DEFAULT_BUDGET_S,
        help=f"seconds of timing (default {DEFAULT_BUDGET_S:g}; {allowed(EvaluationRequest, 'budget')})",
    )
    parser.add_argument(
        "--seeds",
        type=integer(EvaluationRequest, "seeds"),
        default=3,
        help=f"validation seeds per shape and distribution (default 3; {allowed(EvaluationRequest, 'seeds')})",
    )
    parser.add_argument("--json", action="store_true", help="print the evaluation as JSON")
    parser.set_defaults(handler=run_evaluate)


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def _read_source(path: str, option: str = "--source") -> str:
    """The text of a C source file ('-': stdin); UserError for a missing, binary, non-UTF-8 or huge one."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1)
        else:
            file = Path(path).expanduser()
            if not file.is_file():
                what = "not a file" if file.exists() else "no such file"
                raise UserError(f"{option} {path!r}: {what}; pass the path of a C source file")
            with file.open("rb") as handle:
                data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError as error:
        raise UserError(f"{option} {path!r}: cannot read it ({error.strerror or error})") from None
    return _source_text(data, f"{option} {path!r}")


def _source_text(data: bytes, where: str) -> str:
    """``data`` as kernel source: UTF-8 text without NUL bytes, at most `MAX_SOURCE_BYTES`. ``where`` names
    the input in the UserError otherwise (the compiler would only say something far less clear)."""
    if len(data) > MAX_SOURCE_BYTES:
        raise UserError(f"{where}: larger than {MAX_SOURCE_BYTES} bytes; pass a C source file, not data")
    if b"\0" in data:
        raise UserError(
            f"{where}: a binary file (NUL byte at offset {data.index(0)}); pass the C source, not a compiled file"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{where}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
            "save the source as UTF-8"
        ) from None


def _request(args: argparse.Namespace) -> EvaluationRequest:
    """The measuring options, checked against their bounds and this machine's CPUs before anything runs."""
    raw = {"threads": args.threads, "budget": args.budget, "seeds": args.seeds}
    if args.flags is not None:
        raw["flags"] = normalize_flags(args.flags)
    try:
        request = EvaluationRequest.model_validate(raw)
    except ValidationError as error:
        raise UserError(explain(error, EvaluationRequest, OPTION_OF)) from None
    usable = _usable_cpus()
    if request.threads > usable:
        raise UserError(f"--threads {request.threads}: this process may use {usable} CPUs; pass at most {usable}")
    return request


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM becomes a normal exit, so every ``finally`` on the way out runs: sandboxes are killed and their
    folders removed (the default action would end the process on the spot and leave both behind)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
    raise SystemExit(EXIT_TERMINATED)


def run_evaluate(args: argparse.Namespace) -> int:
    if threading.current_thread() is not threading.main_thread():
        return _evaluate(args)  # only the main thread may handle signals; its caller owns them
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _evaluate(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _evaluate(args: argparse.Namespace) -> int:
    request = _request(args)
    problem = load_problem(args.problem)
    source = _read_source(args.source)
    if args.baseline not in BASELINE_CHOICES and Path(args.baseline).expanduser().is_file():
        _read_source(args.baseline, "--baseline")  # refuse a binary baseline here, as the source would be
    try:
        # The step under way on stderr: in place on a terminal, a line per step elsewhere (cli/progress.py).
        with StepProgress("kf evaluate") as progress:
            result = evaluate(
                problem,
                source,
                request.flags,
                args.baseline,
                threads=request.threads,
                budget_s=request.budget,
                seeds=request.seeds,
                target=args.target,
                progress=progress.step,
            )
    except (CalibrationFailed, SandboxFailure) as error:
        print(f"kf evaluate: the machine failed, not the kernel: {error}", file=sys.stderr)
        return EXIT_MACHINE
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        print(render(result))
    if result.verdict == Verdict.harness_error:
        return EXIT_MACHINE
    return 0 if result.verdict == Verdict.ok else 1


def as_json(result: Evaluation) -> dict[str, Any]:
    """The evaluation with the headline keys (verdict, speedup, ci_low, ci_high, shapes, evidence) on top."""
    body = result.model_dump(mode="json")
    body["shapes"] = body["benchmark"]["shapes"] if body.get("benchmark") else []
    return body


def _shape_text(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _time_text(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} us"


def render(result: Evaluation) -> str:
    """Human-readable report: verdict, evidence, per-shape times, speedup with its interval."""
    compiled = result.compile
    lines = [f"{result.problem}: {result.verdict}"]
    if compiled.artifact_id:
        cached = " (cached)" if compiled.cached else ""
        lines.append(f"  compiled: artifact {compiled.artifact_id[:12]}{cached} with {shlex.join(compiled.flags)}")
    lines += [f"  {line}" for line in result.evidence]
    report = result.benchmark
    if report is not None and report.shapes:
        lines.append(f"  per shape (median per call, vs {report.reference}):")
        width = max(len(_shape_text(s.shape)) for s in report.shapes)
        lines.append(f"    {'shape':<{width}}  {'candidate':>10}  {'reference':>10}  {'roofline':>8}  ratio [95% CI]")
        for s in report.shapes:
            lines.append(
                f"    {_shape_text(s.shape):<{width}}  {_time_text(s.candidate_ns):>10}  "
                f"{_time_text(s.reference_ns):>10}  {_fraction_text(s.roofline_ns, s.candidate_ns):>8}  "
                f"{s.ratio:.3f}x [{s.ci_low:.3f}, {s.ci_high:.3f}]"
            )
    if result.speedup is not None:
        lines.append(
            f"  speedup: {result.speedup:.3f}x [{result.ci_low:.3f}, {result.ci_high:.3f}] "
            "(weighted geometric mean over shapes, 95% CI; >1 means faster)"
        )
    if report is not None and report.roofline_fraction is not None:
        lines.append(
            f"  roofline: {report.roofline_fraction:.1%} of this machine's bound (weighted geometric mean over "
            "shapes of the least time its bytes and flops need at the measured bandwidth and peak, over its time)"
        )
    return "\n".join(lines)


def _fraction_text(bound_ns: float | None, time_ns: float) -> str:
    """A shape's roofline fraction as a percentage, or a dash where no bound was computed."""
    return f"{bound_ns / time_ns:.1%}" if bound_ns and time_ns > 0 else "-"
