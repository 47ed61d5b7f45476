"""What a search report shows, as data: the figures, rows and lessons that engine/report/page.py lays out.

Every field is read from the search's event log (engine/report/gather.py), never from Temporal, so a report
can be made after the workflow's history is gone. Text fields hold what the log holds -- labels, rationales,
sources and hints written by proposers (LLMs among them) and users -- and are escaped where they are shown.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from engine.harness.stats import RatioEstimate


class ShapeRoofline(BaseModel):
    """One benchmark shape of one candidate: its time next to the physical bound of this machine."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    shape: str
    """The problem sizes, e.g. ``cols=4096 rows=64``."""
    candidate_ns: float
    """Median time per call of the candidate, nanoseconds."""
    library_ns: float | None
    """Median time per call of the library baseline (numpy on a CPU), nanoseconds; None when the worker could
    not time it (a GPU worker without CuPy)."""
    roofline_ns: float | None
    """The physical lower bound of one call (bytes moved / measured bandwidth, flops / measured peak)."""

    @property
    def fraction(self) -> float | None:
        """roofline_ns / candidate_ns: 1.0 is at the bound."""
        return self.roofline_ns / self.candidate_ns if self.roofline_ns and self.candidate_ns > 0 else None

    @property
    def library_fraction(self) -> float | None:
        """roofline_ns / library_ns: how close the library baseline came to the bound."""
        return self.roofline_ns / self.library_ns if self.roofline_ns and self.library_ns else None


class CandidateEntry(BaseModel):
    """One candidate of the search: where it came from, what was decided, and its figures."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    candidate_id: str
    """Content hash of its source and flags."""
    label: str
    """Its human name (proposer-written)."""
    generation: int | None
    """The generation that proposed it."""
    proposer: str
    """Who proposed it: seed, random, search, llm:explorer:<model>…"""
    rationale: str
    """Why the proposer thought it worth trying (proposer-written)."""
    tags: list[str]
    """The changes that produced it."""
    params: dict[str, Any]
    """Template parameter values, when it came from a template."""
    flags: list[str] | None
    """Compiler flags; None for the backend's defaults."""
    parent_id: str | None
    """The candidate it was derived from."""
    parent_label: str | None
    """That parent's label, when the log names it."""
    changed_params: dict[str, tuple[Any, Any]]
    """Parameter values that differ from the parent's: name -> (parent's value, this one's)."""
    source_diff: str
    """A unified diff of the source against the parent's (the whole source without a known parent); may be
    cut short, which its last line says."""
    verdict: str
    """The kernel's verdict, or harness_error / unfinished / proposed (engine/search/history.py)."""
    summary: str
    """One line from the step that decided the verdict (the first compile error, the failing case, the speedup)."""
    evaluation: int | None
    """Its place in the order the search finished evaluations (1 is the first); None when never evaluated."""
    speedup: RatioEstimate | None
    """Speedup over the library baseline (numpy on a CPU)."""
    ratio: RatioEstimate | None
    """Speedup over the incumbent it was timed against (over the library baseline without one)."""
    roofline_fraction: float | None
    """Weighted geometric mean over shapes of roofline_ns / candidate_ns."""
    shapes: list[ShapeRoofline]
    """Per-shape timings from its benchmark against the library baseline."""
    promoted: bool
    """True when it became the incumbent at some point."""


class EvaluationPoint(BaseModel):
    """One finished evaluation, in the order the search finished them: the x axis of the progress plot."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    number: int
    """1 for the first evaluation the search finished."""
    candidate_id: str
    """The candidate evaluated."""
    verdict: str
    """Its verdict."""
    speedup: RatioEstimate | None
    """Its speedup over the library baseline; None unless it was timed."""


class IncumbentStep(BaseModel):
    """One promotion: from this evaluation on, this was the incumbent."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    after_evaluation: int
    """How many evaluations had finished when it was promoted."""
    candidate_id: str
    """The promoted candidate."""
    label: str
    """Its label."""
    speedup: RatioEstimate
    """Its speedup over the library baseline, as promoted."""
    generation: int
    """The generation at whose end it was promoted."""
    reason: str
    """Why, as the workflow recorded it."""


class ChangeDelta(BaseModel):
    """What the search added to the evidence about one change (a tag or a parameter value)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    change: str
    """The change, e.g. ``UNROLL=8``."""
    attempts_before: int
    """Candidates carrying it with a compile outcome, before the search."""
    attempts_after: int
    """The same, after it."""
    correct_before: int
    """Of the validated ones, correct, before the search."""
    correct_after: int
    """The same, after it."""
    speedup_over_parent_before: float | None
    """Median speedup over the parent of candidates introducing it, before the search."""
    speedup_over_parent_after: float | None
    """The same, after it."""
    dead_end_after: str | None
    """Why it is a dead end after the search, if it is."""


class LessonsReport(BaseModel):
    """The lessons the search started with, and what it added to them."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    available: bool
    """False when they could not be computed (the reason says why)."""
    reason: str = ""
    """Why they are unavailable, or a note on how they were computed."""
    before: str = ""
    """The lessons summary as of the search's start (engine/evidence/lessons.py summarize)."""
    after: str = ""
    """The summary once the search's own events are added (later searches not included)."""
    changes: list[ChangeDelta] = []
    """Per change, the evidence the search added."""
    new_failures: list[str] = []
    """Failure patterns the search added, one line each."""
    new_dead_ends: list[str] = []
    """Changes that became dead ends through the search."""


class SearchReport(BaseModel):
    """Everything the report of one search shows."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    search_id: str
    """The search (workflow) id."""
    problem: str
    """The problem searched."""
    target: str
    """The resolved target (the spec's target until a worker resolved it)."""
    status: str
    """completed, stopped, budget_exhausted, exhausted -- or running, while the log has no search.finished."""
    spec: dict[str, Any]
    """The search's spec as recorded at its start."""
    resumed_from: str | None
    """The search it resumed from, if any."""
    started_at: str | None
    """When search.started was recorded (ISO 8601)."""
    finished_at: str | None
    """When search.finished was recorded (ISO 8601)."""
    hardware: str
    """The machine the benchmarks ran on (CPU model, GPU name), from the events' metadata."""
    events: int
    """Events in the search's stream."""
    verdict_counts: dict[str, int]
    """Candidates per kernel verdict."""
    harness_errors: int
    """Candidates the harness or the infrastructure failed to judge (not a verdict)."""
    timings: int = 0
    """Timings the search took: benchmark steps, re-measurements and playoff rounds."""
    busy_timings: int = 0
    """Of those, the ones taken while other work ran on their cores (a busy machine's readings)."""
    best: RatioEstimate | None
    """The final incumbent's speedup over the library baseline."""
    best_label: str | None
    """The final incumbent's label."""
    best_id: str | None
    """The final incumbent's candidate id."""
    candidates: list[CandidateEntry]
    """Every candidate, in order of evaluation (never-evaluated ones last)."""
    evaluations: list[EvaluationPoint]
    """Every finished evaluation, in order."""
    incumbents: list[IncumbentStep]
    """Every promotion, in order."""
    lessons: LessonsReport
    """The lessons it started with and added."""

    @property
    def baseline(self) -> str:
        """The library baseline speedups are measured against: CuPy on a GPU target, numpy on a CPU."""
        return "CuPy" if self.target.startswith("cuda") else "numpy"
