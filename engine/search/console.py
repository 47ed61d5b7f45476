"""What the Temporal Web UI shows of a search: a summary and details fixed when it starts, and its current details.

The UI is the operator's console. The static summary (one line) and static details are set by whoever starts the
search -- `kf search start` (activities/search_client.py) or a schedule (activities/schedule_client.py) -- and
shown on the workflow's page and in the list; the current details are set by the workflow itself after every
verdict, promotion, generation and message (workflows/kernel_search.py), and the UI renders them as markdown.

Everything here is a pure function of the spec and the state, so the workflow may call it on every step: the
same history always renders the same text (the clock is the workflow's, passed in).
"""

from __future__ import annotations

from datetime import datetime

from engine.search.candidates import Candidate
from engine.search.spec import SearchSpec
from engine.search.state import CandidateOutcome, Incumbent, SearchState

MAX_SETTINGS_CHARS = 120
"""Longest rendering of a candidate's settings in the details (a template's parameters, its flags)."""

MAX_SUMMARY_BYTES = 200
"""Longest static summary Temporal keeps for the list view, in bytes of UTF-8."""
MAX_DETAILS_BYTES = 20_000
"""Longest static details, in bytes of UTF-8."""


def summary(spec: SearchSpec, every: str | None = None) -> str:
    """One line: ``softmax on cpu: 3 generations × 4 candidates, budget 12 candidates, proposer search``; a
    scheduled search adds how often it runs and where it starts."""
    line = (
        f"{spec.problem} on {spec.target}: {spec.generations} generations × {spec.candidates_per_generation} "
        f"candidates, budget {_budget(spec)}, proposer {spec.proposer.kind}"
    )
    if every is not None:
        line += f", every {every}"
    if spec.resume_latest:
        line += ", warm from the newest incumbent"
    elif spec.resume_best:
        line += ", warm from the fastest incumbent"
    elif spec.resume_from:
        line += f", from {spec.resume_from}"
    return _fit(line, MAX_SUMMARY_BYTES)


def static_details(spec: SearchSpec, schedule_id: str | None = None) -> str:
    """Markdown: the settings that do not change while the search runs, and how to steer it."""
    start = "the seed kernel"
    if spec.resume_latest:
        start = (
            f"the newest incumbent of any earlier `{spec.problem}` search on `{spec.target}` (the seed kernel "
            "when there is none), re-timed as generation 0"
        )
    elif spec.resume_best:
        start = (
            f"the fastest incumbent of any earlier `{spec.problem}` search on `{spec.target}` (the seed kernel "
            "when there is none), re-timed as generation 0"
        )
    elif spec.resume_from:
        start = f"the incumbent of `{spec.resume_from}`, re-timed as generation 0"
    lines = [
        f"**Problem** `{spec.problem}` · **target** `{spec.target}` · **task queues** `{spec.task_queue_prefix}-…`",
        f"- **Generations:** {spec.generations} after the seed, {spec.candidates_per_generation} candidates each, "
        f"{spec.parallelism} at once",
        f"- **Starts from:** {start}",
        f"- **Proposer:** {spec.proposer.kind}"
        + (f" ({', '.join(spec.proposer.models)})" if spec.proposer.models else ""),
        f"- **Budget:** {_budget(spec)}",
        f"- **Promotion:** the interval's lower end at {spec.promotion.confidence:.0%} must clear "
        f"{1 + spec.promotion.margin:.2f}× the incumbent",
        f"- **Timing:** {spec.benchmark_seconds:g} s per candidate on {spec.threads} thread(s)",
    ]
    if schedule_id is not None:
        lines.append(f"- **Schedule:** `{schedule_id}` (`kf schedule list`)")
    lines += [
        "",
        "Steer it with an *Update* (the page's workflow actions): `pause`, `resume` and `stop` take no input; "
        '`add_hint` takes a JSON string such as `"try the online softmax"`; `extend_budget` an object such as '
        '`{"max_candidates": 60}`. Or `kf search pause|resume|stop|hint|extend` with this workflow\'s id.',
    ]
    return _fit("\n".join(lines), MAX_DETAILS_BYTES)


def current_details(state: SearchState, now: datetime, leading: CandidateOutcome | None = None) -> str:
    """Markdown: generation k of N and what the search is doing, the incumbent with its settings, the best
    speedup with its interval, the verdicts so far and the budget left. ``leading`` is the fastest correct
    candidate of the running generation, shown while it is ahead of the incumbent (promotion waits for the
    generation's end)."""
    spec = state.spec
    lines = [f"**Generation {state.current_generation} of {spec.generations}** · {state.phase}"]
    inc = state.incumbent
    if inc is None:
        lines.append("- **Incumbent:** none yet (no correct candidate)")
    else:
        lines.append(
            f"- **Incumbent:** {_code(inc.candidate.label)} (`{inc.candidate.candidate_id[:12]}`, generation "
            f"{inc.generation}) · {settings(inc.candidate)}"
        )
        lines.append(f"- **Best speedup:** {_speedup(inc)} at {spec.promotion.confidence:.0%}")
    if leading is not None and leading.speedup is not None and (inc is None or leading.speedup > inc.speedup):
        lines.append(
            f"- **Fastest this generation:** {leading.speedup:.3f}× vs numpy, {_code(leading.label)} "
            f"(`{leading.candidate_id[:12]}`): promotion is decided when the generation ends"
        )
    verdicts = " · ".join(f"{verdict} {count}" for verdict, count in sorted(state.verdict_counts.items()))
    judged = f"{state.candidates_done} judged" + (f" ({verdicts})" if verdicts else "")
    if state.harness_errors:
        judged += f"; {len(state.harness_errors)} not judged (harness_error: the machine failed, not the kernel)"
    lines.append(f"- **Verdicts:** {judged}")
    if state.busy_timings:
        lines.append(
            f"- **Busy machine:** {state.busy_timings} of {state.timings} timings ran while other work used their "
            "cores (re-measured before they promote)"
        )
    lines.append(f"- **Budget left:** {budget_left(state, now)}")
    if spec.hints:
        lines.append(f"- **Hints:** {len(spec.hints)}, latest {_code(spec.hints[-1][:80])}")
    return "\n".join(lines)


def budget_left(state: SearchState, now: datetime) -> str:
    """What remains of each limit: generations, and the budget's candidates, minutes and LLM dollars."""
    spec = state.spec
    more = spec.generations - state.current_generation
    parts = [f"{more} more generation{'s' if more != 1 else ''}" if state.status == "running" else "none (ended)"]
    budget = spec.budget
    if budget.max_candidates is not None:
        parts.append(f"{max(budget.max_candidates - len(state.evaluated), 0)} of {budget.max_candidates} candidates")
    if budget.max_wall_minutes is not None and state.started_at is not None:
        spent = (now - state.started_at).total_seconds() / 60
        parts.append(f"{max(budget.max_wall_minutes - spent, 0):.0f} of {budget.max_wall_minutes:g} min")
    if budget.max_llm_usd is not None:
        parts.append(f"${max(budget.max_llm_usd - state.llm_spend_usd, 0):.2f} of ${budget.max_llm_usd:.2f} LLM")
    return " · ".join(parts)


def settings(candidate: Candidate) -> str:
    """A candidate's settings, short: its template parameters and flags (`NT=4 SIMD=1 · flags -O3`)."""
    if candidate.params:
        text = " ".join(f"{name}={value}" for name, value in sorted(candidate.params.items()))
    elif candidate.tags:
        text = ", ".join(candidate.tags)
    else:
        text = candidate.proposer
    text += " · flags " + (" ".join(candidate.flags) if candidate.flags is not None else "default")
    return _code(text if len(text) <= MAX_SETTINGS_CHARS else text[: MAX_SETTINGS_CHARS - 1] + "…")


def _budget(spec: SearchSpec) -> str:
    budget = spec.budget
    parts = []
    if budget.max_candidates is not None:
        parts.append(f"{budget.max_candidates} candidates")
    if budget.max_wall_minutes is not None:
        parts.append(f"{budget.max_wall_minutes:g} min")
    if budget.max_llm_usd is not None:
        parts.append(f"${budget.max_llm_usd:g} LLM")
    return ", ".join(parts) or "the generations only"


def _speedup(inc: Incumbent) -> str:
    roofline = "" if inc.roofline_fraction is None else f", {inc.roofline_fraction:.1%} of the roofline"
    return f"{inc.speedup:.3f}× vs numpy [{inc.ci_low:.3f}, {inc.ci_high:.3f}]{roofline}"


def _fit(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` bytes of UTF-8 (a problem may be a long folder path), marked with an ellipsis."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - len("…".encode())].decode(errors="ignore") + "…"


def _code(text: str) -> str:
    # A backtick inside would end the code span early and spill the rest as markdown.
    return f"`{text.replace('`', chr(39))}`"
