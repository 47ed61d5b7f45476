"""What every proposer sees and returns."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from engine.problems import Problem
from engine.proposers.failures import RecentFailure
from engine.search.candidates import Candidate


class ProposalContext(BaseModel):
    """Everything a proposer may use to propose the next candidates."""

    search_id: str
    """The search asking."""
    problem: str
    """The problem name or folder."""
    target: str
    """The target's task queue suffix, e.g. `cpu-x86_64-avx512`."""
    machine: str | None = None
    """The machine key of the target's worker (engine/hardware.py machine_key): only evidence taken on it settles
    a setting (engine/proposers/setting_evidence.py settled_candidates); None: unknown, nothing is settled."""
    generation: int
    """The generation being proposed."""
    count: int
    """How many candidates to propose (fewer when the space is exhausted)."""
    seed: int
    """The search's seed; proposers derive their randomness from (seed, generation)."""
    incumbent: Candidate | None = None
    """The best correct candidate so far."""
    seen: list[str] = Field(default_factory=list)
    """Candidate ids already evaluated by this search or the one it resumes: never propose them again."""
    hints: list[str] = Field(default_factory=list)
    """Human hints."""
    flags: list[str] | None = None
    """Compiler flags the search uses."""
    models: list[str] = Field(default_factory=list)
    """litellm model names for LLM proposers (the spec's); empty means `KF_MODELS`."""
    incumbent_evidence: dict[str, Any] = Field(default_factory=dict)
    """The incumbent's evidence shown to LLMs: `speedup`, `ci_low`, `ci_high` (over numpy), `generation`."""
    recent_failures: list[RecentFailure] = Field(default_factory=list)
    """The search's newest failures, newest first (see `recent_failures_from_events`); fixers repair them."""
    lessons_summary: str = ""
    """The lesson summary for this problem and target (about 15 lines); empty when nothing was learned yet."""
    lessons: dict[str, Any] | None = None
    """The structured lessons (an `engine.evidence.lessons.Lessons` dump: priors per change) the search proposer
    samples from; None when none were loaded."""
    llm_spent_usd: float = 0.0
    """What the search's LLM calls have cost so far."""
    llm_budget_usd: float | None = None
    """The search's LLM budget (`budget.max_llm_usd`); None: no limit."""


class Proposer(Protocol):
    """An agent that proposes candidates."""

    name: str

    def propose(self, problem: Problem, context: ProposalContext) -> list[Candidate]:
        """Up to ``context.count`` new candidates, none of them in ``context.seen``."""
        ...
