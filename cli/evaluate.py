"""``kf evaluate``: compile, validate and benchmark one kernel source, and say what it is worth.

    kf evaluate --problem softmax --source my.c [--flags "-O3 -march=native"] [--baseline reference|seed|FILE]
                [--threads N] [--budget SECONDS] [--json]

Exit status 0 only when the verdict is ok; 1 for any other verdict of the kernel; 2 for bad input; 3 when
the machine failed, not the kernel (verdict harness_error, a sandbox that could not start, a calibration
that failed); 143 when terminated (SIGTERM), after its sandboxes are killed and their folders removed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from engine.errors import UserError
from engine.harness.benchmarking import DEFAULT_BUDGET_S
from engine.harness.cpu import DEFAULT_FLAGS
from engine.harness.driver import SandboxFailure
from engine.harness.evaluation import evaluate
from engine.harness.machine import CalibrationFailed
from engine.harness.verdicts import Evaluation, Verdict
from engine.problems import load_problem

EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_MACHINE = 3


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="compile, validate and benchmark a kernel source",
        description=(
            "Compile a C kernel for a problem, validate it on fresh inputs in a sandbox, and time it against "
            "a baseline, interleaved, with a 95%% confidence interval. Exit status 0 only for verdict ok; 1 for "
            f"any other verdict; 2 for bad input; {EXIT_MACHINE} when the machine failed, not the kernel; "
            f"{EXIT_TERMINATED} when terminated (SIGTERM), after its sandboxes are cleaned up."
        ),
    )
    parser.add_argument("--problem", required=True, help="a built-in problem name or a problem folder")
    parser.add_argument("--source", required=True, help="the C source file of the kernel ('-' reads stdin)")
    parser.add_argument(
        "--flags", default=None, help=f"compiler flags in one string (default: {shlex.join(DEFAULT_FLAGS)!r})"
    )
    parser.add_argument(
        "--baseline",
        default="reference",
        help="reference (numpy, the default), seed (the problem's naive kernel) or a C file",
    )
    parser.add_argument("--threads", type=int, default=1, help="cores the kernel may use (default 1)")
    parser.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET_S, help=f"seconds of timing (default {DEFAULT_BUDGET_S:g})"
    )
    parser.add_argument("--seeds", type=int, default=3, help="validation seeds per shape and distribution")
    parser.add_argument("--json", action="store_true", help="print the evaluation as JSON")
    parser.set_defaults(handler=run_evaluate)


def _read_source(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"--source {path!r}: no such file; pass the path of a C source file")
    return file.read_text()


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
    if args.threads < 1:
        raise UserError(f"--threads {args.threads}: must be at least 1")
    if args.budget <= 0:
        raise UserError(f"--budget {args.budget}: must be a positive number of seconds")
    problem = load_problem(args.problem)
    source = _read_source(args.source)
    flags = shlex.split(args.flags) if args.flags is not None else None
    try:
        result = evaluate(
            problem, source, flags, args.baseline, threads=args.threads, budget_s=args.budget, seeds=args.seeds
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
        lines.append(f"    {'shape':<{width}}  {'candidate':>10}  {'reference':>10}  ratio [95% CI]")
        for s in report.shapes:
            lines.append(
                f"    {_shape_text(s.shape):<{width}}  {_time_text(s.candidate_ns):>10}  "
                f"{_time_text(s.reference_ns):>10}  {s.ratio:.3f}x [{s.ci_low:.3f}, {s.ci_high:.3f}]"
            )
    if result.speedup is not None:
        lines.append(
            f"  speedup: {result.speedup:.3f}x [{result.ci_low:.3f}, {result.ci_high:.3f}] "
            "(weighted geometric mean over shapes, 95% CI; >1 means faster)"
        )
    return "\n".join(lines)
