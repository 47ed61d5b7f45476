"""A closed search's progress as its event log tells it, for `kf search show` when no worker is left to answer the
`status` query of a search that failed or was terminated (a completed one keeps its progress in its result).

The log holds every candidate's steps, the promotions, the spec the search started with, each proposal's LLM spend
(``generation.proposed``) and the hints added while it ran (``search.hint_added``), so the figures a user reads --
verdicts, candidates judged, harness errors, the incumbent and its interval, timings, spend, hints -- come out as the
workflow kept them. What was under way when it ended (the running step, the generation's fastest candidate before
its promotion) is not; ``from_log`` says the status was built so."""

from __future__ import annotations

from typing import Any

from engine.search.candidates import short_name
from engine.search.history import SearchHistory, was_busy
from engine.search.state import SearchStatus


def logged_status(history: SearchHistory, status: str, *, problem: str | None, target: str | None) -> SearchStatus:
    """The progress of the search ``history`` folds, ended as ``status`` (failed, terminated, ...). ``problem``
    and ``target`` stand in where the log holds no ``search.started`` event (a search that ended before its first
    step): Temporal's search attributes."""
    spec: dict[str, Any] = dict((history.started.payload.get("spec") if history.started else None) or {})
    budget = spec.get("budget") or {}
    counts = history.verdict_counts
    generations = [record.generation for record in history.candidates.values() if record.generation is not None]
    timings = history.timings
    incumbent = history.incumbent
    hints = [str(hint) for hint in spec.get("hints") or []]
    spent = 0.0
    for event in history.events:
        if event.type == "generation.proposed":
            spent += float(event.payload.get("spent_usd") or 0.0)
        elif event.type == "search.hint_added" and event.payload.get("text"):
            hints.append(str(event.payload["text"]))
    return SearchStatus(
        search_id=history.search_id,
        problem=str(spec.get("problem") or problem or "?"),
        target=str(spec.get("target") or target or "?"),
        target_queue=None,
        status=status,
        generation=max(generations, default=0),
        generations=int(spec.get("generations") or 0),
        candidates_done=sum(counts.values()),
        verdict_counts=counts,
        harness_errors=len(history.harness_errors),
        best_speedup=incumbent.speedup if incumbent else None,
        incumbent=short_name(incumbent.candidate.label, incumbent.candidate.candidate_id) if incumbent else None,
        incumbent_id=incumbent.candidate.candidate_id if incumbent else None,
        llm_spend_usd=spent,
        hints=hints,
        best_ci_low=incumbent.ci_low if incumbent else None,
        best_ci_high=incumbent.ci_high if incumbent else None,
        best_roofline_fraction=incumbent.roofline_fraction if incumbent else None,
        max_candidates=budget.get("max_candidates"),
        timings=len(timings),
        busy_timings=sum(was_busy(event) for event in timings),
        from_log=True,
    )
