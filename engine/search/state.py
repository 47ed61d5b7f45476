"""What a search carries from generation to generation, and across continue-as-new."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from engine.evidence.events import StreamHead
from engine.search.candidates import Candidate
from engine.search.spec import SearchSpec


class Incumbent(BaseModel):
    """The best correct candidate so far, and how it compares with numpy."""

    candidate: Candidate
    """The candidate itself (source, flags, lineage)."""
    artifact_id: str
    """Content hash of its compiled artifact on the target."""
    speedup: float
    """Speedup over the numpy baseline (weighted geometric mean over benchmark shapes; > 1 is faster)."""
    ci_low: float
    """Lower end of the speedup's confidence interval."""
    ci_high: float
    """Upper end of the speedup's confidence interval."""
    generation: int
    """Generation in which it was promoted (0 for the seed kernel)."""
    roofline_fraction: float | None = None
    """Fraction of the machine's roofline it reached when timed (1.0 is at the bound): the headroom left.
    None for incumbents promoted before it was recorded."""


class CandidateOutcome(BaseModel):
    """Where one candidate's evaluation ended."""

    candidate_id: str
    """The candidate's content hash."""
    label: str
    """Its human name."""
    verdict: str
    """The kernel's verdict: ok (compiled, correct and timed), compile_error, incorrect, crash, timeout,
    resource_limit, forbidden, impossible -- or harness_error: the harness or the infrastructure failed past its
    retries, so the candidate was never judged (no verdict; not counted with the verdicts)."""
    artifact_id: str | None = None
    """Its compiled artifact, when it compiled."""
    ratio: float | None = None
    """Speedup over the incumbent at the time (or over numpy when there was none)."""
    ratio_ci_low: float | None = None
    """Lower end of that ratio's interval."""
    ratio_ci_high: float | None = None
    """Upper end of that ratio's interval."""
    speedup: float | None = None
    """Speedup over numpy."""
    speedup_ci_low: float | None = None
    """Lower end of the speedup over numpy's interval."""
    speedup_ci_high: float | None = None
    """Upper end of the speedup over numpy's interval."""
    roofline_fraction: float | None = None
    """Fraction of the machine's roofline it reached (1.0 is at the bound); None when not timed or not known."""
    shared_cores: bool = False
    """Its timing shared its cores with other work (the machine was busy): re-measured before it promotes."""
    reused: bool = False
    """True when the outcome was found in the event log rather than measured again."""
    timed_against: str | None = None
    """The artifact id of the incumbent its ratio was measured against, head to head in one run (None: timed
    against numpy alone, or not timed). A ratio compares with the current incumbent only when this is its artifact.
    None in outcomes recorded before it was kept."""
    remeasured: bool = False
    """True when its first reading was shaky and the figures here are a re-measurement's (with the playoff's
    larger budget, recorded as candidate.remeasured), taken before the generation's promotion."""


class Contender(BaseModel):
    """A correct, timed candidate kept for the search's final playoff."""

    candidate: Candidate
    """The candidate itself."""
    outcome: CandidateOutcome
    """Its evaluation (verdict ok, with its artifact and speedup over numpy)."""


class SearchState(BaseModel):
    """The whole state of a search; passed to the next run on continue-as-new."""

    search_id: str
    """The workflow id, stable across continue-as-new; the event stream is `search-<search_id>`."""
    spec: SearchSpec
    """What the user asked for (budget and hints change through updates)."""
    target_queue: str | None = None
    """The hardware task queue the target resolved to, once a worker answered."""
    target_machine: str | None = None
    """The machine key of the worker that answered for the target (engine/hardware.py machine_key); None until
    one answered, or when it predates the key."""
    generation: int = 0
    """The next generation to run; 0 evaluates the seed kernel."""
    incumbent: Incumbent | None = None
    """The best correct candidate so far."""
    evaluated: list[str] = Field(default_factory=list)
    """Ids of every candidate evaluated (or reused) by this search, in order."""
    verdict_counts: dict[str, int] = Field(default_factory=dict)
    """How many candidates the kernel's verdict ended, per verdict; harness errors are not verdicts."""
    harness_errors: list[str] = Field(default_factory=list)
    """Ids of the candidates the harness or the infrastructure failed to judge (in ``evaluated``, never in
    ``verdict_counts``)."""
    paused: bool = False
    """True while a `pause` is in force: no new work starts."""
    stop_requested: bool = False
    """True after `stop`: the current step finishes, then the search ends with a complete record."""
    llm_spend_usd: float = 0.0
    """Spend on LLM calls so far."""
    started_at: datetime | None = None
    """When the search started (workflow time), for the wall-time budget."""
    promotions: list[dict[str, Any]] = Field(default_factory=list)
    """Every promotion: generation, candidate id, label, speedup and interval."""
    contenders: list[Contender] = Field(default_factory=list)
    """The fastest correct candidates timed so far (at most PLAYOFF_CONTENDERS, by speedup over numpy): who
    the final playoff may time against the incumbent."""
    playoff_rounds: list[dict[str, Any]] = Field(default_factory=list)
    """The final playoff's rounds, once it ran: challenger, leader, ratio and interval, winner."""
    timings: int = 0
    """Timings this search took: benchmarks, re-measurements and playoff rounds that finished (one per recorded
    timing event: a benchmark is never reused from another search)."""
    busy_timings: int = 0
    """Of ``timings``, those whose cores ran other work meanwhile (``shared_cores``): a busy machine's readings."""
    status: str = "running"
    """running, paused, completed, stopped, budget_exhausted, exhausted (nothing new to propose)."""
    head: StreamHead | None = None
    """The search's event stream as of its newest recorded step: kept in Temporal's history, it is the
    witness `kf audit` checks the log against (engine/search/witness.py)."""

    @property
    def stream_id(self) -> str:
        return f"search-{self.search_id}"

    @property
    def candidates_done(self) -> int:
        """Candidates judged: evaluated (or reused) with a verdict; harness errors are not judged."""
        failed = set(self.harness_errors)
        return sum(1 for cid in self.evaluated if cid not in failed)

    @property
    def current_generation(self) -> int:
        """The generation running now, or the last one run once the search has ended: what people are shown.

        ``generation`` is the next generation to run, so it reads N+1 after the last of N (and a stop between
        generations leaves it at one never run): never shown as such."""
        if self.status != "running":
            return max(self.generation - 1, 0)
        return min(self.generation, self.spec.generations)

    @property
    def phase(self) -> str:
        """What the search is doing, for people: running, paused or stopping while it runs; then its status."""
        if self.status != "running":
            return self.status
        if self.stop_requested:
            return "stopping"
        return "paused" if self.paused else "running"


class SearchStatus(BaseModel):
    """What the `status` query answers: the progress a user watches."""

    search_id: str
    """The search (workflow) id."""
    problem: str
    """The problem searched."""
    target: str
    """The target asked for."""
    target_queue: str | None
    """The hardware task queue serving it."""
    status: str
    """running, paused, completed, stopped, budget_exhausted, exhausted (nothing new to propose)."""
    generation: int
    """The generation now running (or the last one)."""
    generations: int
    """Generations asked for."""
    candidates_done: int
    """Candidates judged so far (harness errors not included)."""
    verdict_counts: dict[str, int]
    """Candidates judged, per verdict."""
    harness_errors: int = 0
    """Candidates the harness or the infrastructure failed to judge: not a verdict (see `kf audit`)."""
    best_speedup: float | None
    """The incumbent's speedup over numpy."""
    incumbent: str | None
    """The incumbent's label and id prefix."""
    incumbent_id: str | None
    """The incumbent's candidate id."""
    llm_spend_usd: float
    """Spend on LLM calls so far."""
    hints: list[str]
    """Hints proposers see."""
    best_ci_low: float | None = None
    """Lower end of the incumbent's speedup interval."""
    best_ci_high: float | None = None
    """Upper end of the incumbent's speedup interval."""
    best_roofline_fraction: float | None = None
    """The incumbent's fraction of the machine's roofline (1.0 is at the bound)."""
    leading_speedup: float | None = None
    """The fastest correct candidate measured in the running generation, over numpy: promotion is decided when
    the generation ends, so until then this may be ahead of ``best_speedup``."""
    leading: str | None = None
    """That candidate's label and id prefix."""
    max_candidates: int | None = None
    """The budget's candidate limit, when it has one: what the progress bar counts against."""
    timings: int = 0
    """Timings taken so far: benchmarks, re-measurements and playoff rounds."""
    busy_timings: int = 0
    """Of those, the ones taken while other work ran on their cores (a busy machine's readings)."""
    step: str = ""
    """What is under way now: "proposing 4 candidates", "compiling 1 · benchmarking 2" (candidates per step),
    "final playoff round 1 of 3"; empty between steps and once the search has ended."""
    waiting: list[str] = Field(default_factory=list)
    """Steps that wait for a worker no live one polls for: one line per task queue, naming the queue, since when,
    and the fix (`kf worker` on that hardware). Not the workflow's answer: Temporal's pending steps and poller lists,
    added by the client that asks (activities/search_client.py waiting_for); empty when every step can start."""
    from_log: bool = False
    """Built from the event log, not answered by the workflow (a search that failed or was terminated, with no
    worker left to answer; engine/search/logged_status.py): what was under way when it ended is not there."""


class SearchResult(BaseModel):
    """What a finished search returns."""

    search_id: str
    """The search (workflow) id."""
    status: str
    """completed, stopped, budget_exhausted or exhausted (nothing new to propose)."""
    best_speedup: float | None
    """The incumbent's speedup over numpy."""
    best_ci_low: float | None
    """Lower end of its interval."""
    best_ci_high: float | None
    """Upper end of its interval."""
    best_roofline_fraction: float | None = None
    """The incumbent's fraction of the machine's roofline (1.0 is at the bound): how much headroom is left."""
    incumbent: Candidate | None
    """The incumbent at the end."""
    candidates_done: int
    """Candidates judged (harness errors not included)."""
    verdict_counts: dict[str, int]
    """Candidates judged, per verdict."""
    harness_errors: int = 0
    """Candidates the harness or the infrastructure failed to judge: not a verdict (see `kf audit`)."""
    generations_run: int
    """Generations completed, counting the seed's generation 0."""
    playoff_rounds: list[dict[str, Any]] = Field(default_factory=list)
    """The final playoff's rounds (empty when no candidate came close enough to the incumbent to need one)."""
    timings: int = 0
    """Timings the search took: benchmarks, re-measurements and playoff rounds."""
    busy_timings: int = 0
    """Of those, the ones taken while other work ran on their cores: a busy machine's readings, which promote only
    after a re-measurement (`kf audit` marks each one)."""
    progress: SearchStatus | None = None
    """The search's progress as it ended (what its `status` query answers then): `kf search show` reads a finished
    search's from here, so it needs no worker to ask. None in the results of searches that ended before it was
    kept (they are asked, as running ones are)."""
    head: StreamHead | None = None
    """The search's event stream when it finished (its ``search.finished`` event or a later message): the
    stream must end exactly here (`kf audit` checks)."""
