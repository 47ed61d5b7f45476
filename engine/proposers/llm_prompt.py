"""The prompts of the LLM roles: what a model sees about the problem, the incumbent and the evidence.

Every role sees the same briefing — the problem and its semantics, the ABI, the target, the incumbent with
its evidence, recent failures, the lesson summary and human hints — and a task of its own:

- explorer: a new algorithm for the problem, not a retouch of the incumbent;
- tuner: the incumbent, parameterised and tuned (unrolling, blocking, vector width, accumulators);
- fixer: one failing candidate (or rejected reply) repaired from its compile error or worst failing case.

The reply format is fixed so replies can be checked: one fenced ```c block, a `RATIONALE:` line and a `TAGS:`
line (the changes it makes, which the lessons projection counts).
"""

from __future__ import annotations

from typing import Any

from engine.problems import Problem
from engine.proposers.base import ProposalContext
from engine.proposers.failures import RecentFailure
from engine.proposers.llm_reply import ALLOWED_INCLUDES
from engine.proposers.outcomes import Role

SOURCE_LIMIT = 12_000
"""Characters of a source shown in a prompt (the seed, the incumbent, a failing candidate)."""
FAILURES_SHOWN = 3
"""Recent failures listed in every prompt (the fixer's own failure is shown in full besides)."""

ROLE_TASKS: dict[str, str] = {
    "explorer": (
        "You are the EXPLORER. Propose a different algorithm or data-flow for this kernel than the incumbent "
        "uses (e.g. fusing passes, an online/one-pass formulation, blocking for cache, explicit SIMD), one "
        "that could plausibly be much faster on the target while staying within tolerance."
    ),
    "tuner": (
        "You are the TUNER. Keep the incumbent's algorithm and make it faster on the target: tune unrolling, "
        "the number of independent accumulators, vector width, loop order and blocking sizes. Choose concrete "
        "values; expose them as #define constants at the top so the next tuner can change them."
    ),
    "fixer": (
        "You are the FIXER. The candidate below failed. Repair it so it compiles and is correct on every "
        "shape (including 1x1 and sizes that are not multiples of your vector width), keeping its idea and "
        "speed. Change only what the error requires."
    ),
}


def system_prompt(problem: Problem, target: str, role: Role) -> str:
    """The standing instructions: who the model is, the rules a kernel must follow and the reply format."""
    cuda = target.startswith("cuda")
    language = "CUDA C++" if cuda else "C (C11)"
    headers = [f"- Include only these headers: {', '.join(sorted(ALLOWED_INCLUDES))}."]
    if cuda:
        # The CUDA backend refuses any #include and launches the kernel from its own `kf-launch` line
        # (engine/harness/cuda/launch.py): a candidate without one cannot run.
        headers = [
            "- No #include at all: write helpers yourself (bfloat16 arrays are unsigned short bit patterns,",
            "  widened with __uint_as_float(h << 16)); built-ins such as __shfl_xor_sync, __ldg, exp2f need none.",
            "- Give the launch in exactly one line, expressions over the size names with + - * // % min max cdiv:",
            "  `// kf-launch: grid=(cdiv(rows, 4), 1, 1) block=(128, 1, 1) shared=0` (shared: dynamic bytes).",
        ]
    return "\n".join(
        [
            f"You are an expert performance engineer writing {language} compute kernels for target {target}.",
            ROLE_TASKS[role],
            "",
            "Rules:",
            f"- Define exactly `{problem.signature}` with external linkage; keep the ABI unchanged.",
            "- Write every element of every output; never read or write past a buffer; inputs are read-only.",
            "- Handle every size, including 1 and sizes that are not multiples of your unroll or vector width.",
            *headers,
            "- No I/O, no system calls, no processes, threads, files, sockets, environment or dynamic loading;",
            "  no main(). The harness times and validates the kernel itself.",
            "",
            "Reply format: exactly one fenced ```c code block holding the whole source file, then two lines:",
            "RATIONALE: <one sentence: why this should be faster or why it is now correct>",
            "TAGS: <comma-separated changes, e.g. online-softmax, unroll=8, simd, fused-passes>",
        ]
    )


def _bounded(text: str, limit: int = SOURCE_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n/* … {len(text) - limit} more characters */"


def _abi_lines(problem: Problem) -> list[str]:
    lines = []
    for p in problem.params:
        if p.is_array:
            access = {"in": "read-only input", "out": "output", "inout": "read and written"}[p.role]
            lines.append(f"- `{p.name}`: {p.dtype} array [{', '.join(p.shape)}], C-contiguous, {access}")
        elif p.role == "size":
            lines.append(f"- `{p.name}`: {p.dtype} size")
        else:
            lines.append(f"- `{p.name}`: {p.dtype} scalar")
    return lines


def _evidence_line(evidence: dict[str, Any]) -> str:
    if not evidence:
        return "Evidence: not measured yet."
    parts = []
    speedup = evidence.get("speedup")
    if speedup is not None:
        low, high = evidence.get("ci_low"), evidence.get("ci_high")
        interval = f" (95% interval [{low:.3f}, {high:.3f}])" if low is not None and high is not None else ""
        parts.append(f"{speedup:.3f}x faster than numpy{interval}")
    for key, value in evidence.items():
        if key not in ("speedup", "ci_low", "ci_high"):
            parts.append(f"{key}: {value}")
    return "Evidence: " + "; ".join(parts) + "."


def _failure_block(failure: RecentFailure, with_source: bool) -> list[str]:
    name = failure.label or (failure.candidate_id or "")[:12] or "a reply"
    category = f" [{failure.category}]" if failure.category else ""
    lines = [f"- {name}: {failure.stage} failed with {failure.verdict}{category}: {failure.message}"]
    if with_source and failure.source:
        fence = "```c" if failure.stage != "proposal" else "```text"
        lines += [fence, _bounded(failure.source).rstrip("\n"), "```"]
    return lines


def user_prompt(problem: Problem, context: ProposalContext, role: Role, failure: RecentFailure | None) -> str:
    """The briefing and the role's task."""
    doc = (problem.module.__doc__ or "").strip() or f"See the reference of problem {problem.name!r}."
    lines = [
        f"# Problem: {problem.name} (family {problem.family})",
        doc,
        "",
        "## ABI",
        f"`{problem.signature}`",
        *_abi_lines(problem),
        f"Correctness is checked against a float64 reference; tolerances: {problem.module.TOLERANCES}.",
        f"Benchmark shapes: {[shape for shape, _ in problem.benchmark_shapes]}.",
        "",
        "## Target",
        f"{context.target}; compiler flags: {context.flags if context.flags else 'the backend defaults'}.",
        "",
    ]
    incumbent = context.incumbent
    if incumbent is not None:
        lines += [
            f"## Incumbent: {incumbent.label} (proposed by {incumbent.proposer})",
            _evidence_line(context.incumbent_evidence),
            "```c",
            _bounded(incumbent.source).rstrip("\n"),
            "```",
            "",
        ]
    else:
        lines += ["## Seed kernel (no incumbent yet)", "```c", _bounded(problem.seed_source()).rstrip("\n"), "```", ""]
    others = [f for f in context.recent_failures if f is not failure][:FAILURES_SHOWN]
    if others:
        lines += ["## Recent failures (avoid repeating them)"]
        for other in others:
            lines += _failure_block(other, with_source=False)
        lines.append("")
    if context.lessons_summary.strip():
        lines += ["## Lessons from earlier evidence", context.lessons_summary.strip(), ""]
    if context.hints:
        lines += ["## Hints from the engineer", *(f"- {hint}" for hint in context.hints), ""]
    lines.append("## Your task")
    if role == "fixer" and failure is not None:
        if failure.stage == "proposal":
            lines += [
                "The previous reply was rejected before compiling:",
                *_failure_block(failure, with_source=True),
                "Write the kernel again, following the rules and the reply format exactly.",
            ]
        else:
            lines += ["Repair this candidate:", *_failure_block(failure, with_source=True)]
    elif role == "tuner":
        lines.append("Tune the incumbent (or the seed kernel) for the benchmark shapes on this target.")
    else:
        lines.append("Propose a new algorithm for this kernel.")
    return "\n".join(lines)


def build_messages(
    problem: Problem, context: ProposalContext, role: Role, failure: RecentFailure | None = None
) -> list[dict[str, str]]:
    """The chat messages of one request."""
    return [
        {"role": "system", "content": system_prompt(problem, context.target, role)},
        {"role": "user", "content": user_prompt(problem, context, role, failure)},
    ]
