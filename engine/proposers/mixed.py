"""The mixed proposer: a swarm in which LLM roles and an offline proposer share one generation.

The LLMs are asked for half the count (rounded up): fixers when there are recent failures, else explorers
and tuners. The offline proposer (the search proposer, as `proposer_for("mixed")` builds it) fills
the rest, and also whatever the LLMs did not deliver — a rejected reply, a failed call or an exhausted
budget never leaves a generation short.
"""

from __future__ import annotations

from engine.problems import Problem
from engine.proposers.base import ProposalContext, Proposer
from engine.proposers.llm import LLMProposer
from engine.proposers.outcomes import ProposalBatch
from engine.search.candidates import Candidate


class MixedProposer:
    """LLM roles for half of each generation, an offline proposer for the rest."""

    name = "mixed"

    def __init__(self, llm: LLMProposer, offline: Proposer) -> None:
        self.llm = llm
        self.offline = offline

    def propose(self, problem: Problem, context: ProposalContext) -> list[Candidate]:
        """Up to ``context.count`` new candidates (failures and calls are dropped; use propose_with_outcomes)."""
        return self.propose_with_outcomes(problem, context).candidates

    def propose_with_outcomes(self, problem: Problem, context: ProposalContext) -> ProposalBatch:
        """The LLMs' share first, then the offline proposer's, never proposing one candidate twice."""
        llm_share = (context.count + 1) // 2
        batch = self.llm.propose_with_outcomes(problem, context.model_copy(update={"count": llm_share}))
        taken = [c.candidate_id for c in batch.candidates]
        rest = context.count - len(batch.candidates)
        if rest > 0:
            offline_context = context.model_copy(update={"count": rest, "seen": [*context.seen, *taken]})
            batch.candidates += [
                c for c in self.offline.propose(problem, offline_context) if c.candidate_id not in taken
            ][:rest]
        return batch
