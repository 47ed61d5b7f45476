"""What one proposal round produced besides candidates: rejected replies and the LLM calls they cost.

``propose_batch(proposer, problem, context)`` asks any proposer for a ``ProposalBatch``. The propose
activity records each ``ProposalFailure`` as a `proposal.failed` event and each ``LLMCall`` as an
`llm.called` event, and adds ``ProposalBatch.spent_usd`` to the search's LLM spend.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from engine.problems import Problem
from engine.proposers.base import ProposalContext, Proposer
from engine.search.candidates import Candidate

Role = Literal["explorer", "tuner", "fixer"]
CallStatus = Literal["ok", "rate_limited", "timeout", "error", "budget_exhausted"]
CostSource = Literal["litellm", "configured", "reserved", "unknown"]
RejectReason = Literal[
    "no_code",
    "empty_code",
    "missing_entry",
    "wrong_arity",
    "forbidden_include",
    "forbidden_call",
    "duplicate",
    "call_failed",
    "price_unknown",
]


class LLMCall(BaseModel):
    """One request to a model (with its retries): what it cost and how it went."""

    model: str
    """The litellm model name, e.g. `openai/gpt-4o` or `openai/<local name>`."""
    role: Role
    """The proposer role that asked."""
    status: CallStatus
    """`ok`; `rate_limited` / `timeout` when every attempt was; `error` for an error not worth retrying;
    `budget_exhausted` when a retry no longer fit the budget."""
    attempts: int = 0
    """HTTP requests sent (1 plus the retries)."""
    prompt_tokens: int = 0
    """Input tokens the provider reported (0 when it reported none)."""
    completion_tokens: int = 0
    """Output tokens the provider reported."""
    latency_s: float = 0.0
    """Seconds spent waiting for the provider, over all attempts, without the back-off sleeps."""
    backoff_s: float = 0.0
    """Seconds slept between attempts."""
    cost_usd: float = 0.0
    """What the call cost; attempts that timed out count at their worst-case estimate (they may be billed)."""
    cost_known: bool = False
    """False when the model's price is unknown (cost_usd is then 0) or the provider reported no usage."""
    cost_source: CostSource = "unknown"
    """`litellm` (litellm.completion_cost), `configured` (KF_LLM_MODEL_CONFIG prices), `reserved` (the
    worst-case estimate, used when the provider reported no usage) or `unknown`."""
    reserved_usd: float = 0.0
    """The worst-case estimate reserved before sending (prompt tokens and max_tokens at the model's price)."""
    error: str = ""
    """The last error's message (API keys redacted), empty when ok."""


class ProposalFailure(BaseModel):
    """A proposal that produced no candidate: a reply rejected before compiling, or a call that failed."""

    reason: RejectReason
    """Why: `no_code`, `empty_code`, `missing_entry`, `wrong_arity`, `forbidden_include`, `forbidden_call`,
    `duplicate` (the candidate was already proposed or evaluated), `call_failed`, `price_unknown`."""
    message: str
    """One readable line naming what was wrong."""
    role: Role
    """The proposer role that asked."""
    model: str
    """The model that replied."""
    reply_excerpt: str = ""
    """The start of the reply (bounded), so the fixer and a person can see what came back."""
    parent_id: str | None = None
    """The candidate the proposal started from (the incumbent, or the failure being fixed)."""
    generation: int | None = None
    """The generation being proposed."""

    @property
    def label(self) -> str:
        """A short human name for the rejected reply."""
        return f"llm {self.role} {self.model}"


class ProposalBatch(BaseModel):
    """Everything one proposal round produced."""

    candidates: list[Candidate] = Field(default_factory=list)
    """New candidates, none of them in ``ProposalContext.seen``."""
    failures: list[ProposalFailure] = Field(default_factory=list)
    """Proposals that produced no candidate; each becomes a `proposal.failed` event."""
    calls: list[LLMCall] = Field(default_factory=list)
    """LLM calls made; each becomes an `llm.called` event."""
    budget_exhausted: bool = False
    """True when the LLM budget stopped a proposal from being sent (the search should stop asking LLMs)."""
    stop_reason: str = ""
    """Why proposals stopped early, in words (e.g. the budget's figures)."""

    @property
    def spent_usd(self) -> float:
        """What this round's LLM calls cost, to add to the search's spend."""
        return sum(c.cost_usd for c in self.calls)

    def outcome_events(self, search_id: str, generation: int) -> list[tuple[str, str, dict[str, Any]]]:
        """(event id, type, payload) of every `proposal.failed` and `llm.called` event of this round.

        Append them in the same batch as the round's `generation.proposed`: a retried propose activity then
        finds the whole round recorded and never calls the models (or spends) twice."""
        prefix = f"{search_id}/g{generation}"
        records = [
            (f"{prefix}/proposal-failed/{i}", "proposal.failed", f.model_dump(mode="json") | {"label": f.label})
            for i, f in enumerate(self.failures)
        ]
        records += [
            (f"{prefix}/llm-call/{i}", "llm.called", c.model_dump(mode="json") | {"generation": generation})
            for i, c in enumerate(self.calls)
        ]
        return records


def propose_batch(proposer: Proposer, problem: Problem, context: ProposalContext) -> ProposalBatch:
    """Ask any proposer for a batch: LLM and mixed proposers report failures and calls, others only candidates."""
    with_outcomes = getattr(proposer, "propose_with_outcomes", None)
    if with_outcomes is not None:
        batch: ProposalBatch = with_outcomes(problem, context)
        return batch
    return ProposalBatch(candidates=proposer.propose(problem, context))
