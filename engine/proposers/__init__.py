"""Proposer agents: each turns a ProposalContext into new candidates.

``proposer_for(kind)`` is the one place that maps a SearchSpec's ``proposer.kind`` to an agent.
"""

from __future__ import annotations

from engine.errors import UserError
from engine.proposers.base import ProposalContext, Proposer
from engine.proposers.gp import GaussianProcessProposer
from engine.proposers.llm import LLMProposer
from engine.proposers.mixed import MixedProposer
from engine.proposers.outcomes import LLMCall, ProposalBatch, ProposalFailure, propose_batch
from engine.proposers.random_template import RandomTemplateProposer
from engine.proposers.search import SearchProposer

__all__ = [
    "GaussianProcessProposer",
    "LLMCall",
    "LLMProposer",
    "MixedProposer",
    "ProposalBatch",
    "ProposalContext",
    "ProposalFailure",
    "Proposer",
    "RandomTemplateProposer",
    "SearchProposer",
    "propose_batch",
    "proposer_for",
]


def proposer_for(kind: str, models: list[str] | None = None) -> Proposer:
    """The proposer agent for a SearchSpec's ``proposer.kind``.

    ``models`` (the spec's ``proposer.models``) lets `llm` and `mixed` fail here, before any work, when
    neither the spec nor ``KF_MODELS`` names a model."""
    if kind == "random":
        return RandomTemplateProposer()
    if kind == "search":
        return SearchProposer()
    if kind == "gp":
        return GaussianProcessProposer()
    if kind in ("llm", "mixed"):
        llm = LLMProposer()
        if models is not None:
            llm.models_for(models)
        if kind == "llm":
            return llm
        # The swarm's offline share (and whatever the models fail to deliver) goes to the search proposer.
        return MixedProposer(llm, SearchProposer())
    raise UserError(f"proposer {kind!r} is not available yet; use proposer kind 'random', 'search' or 'gp'")
