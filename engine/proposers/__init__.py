"""Proposer agents: each turns a ProposalContext into new candidates.

``proposer_for(kind)`` is the one place that maps a SearchSpec's ``proposer.kind`` to an agent.
"""

from __future__ import annotations

from engine.errors import UserError
from engine.proposers.base import ProposalContext, Proposer
from engine.proposers.random_template import RandomTemplateProposer

__all__ = ["ProposalContext", "Proposer", "RandomTemplateProposer", "proposer_for"]


def proposer_for(kind: str) -> Proposer:
    """The proposer agent for a SearchSpec's ``proposer.kind``."""
    if kind == "random":
        return RandomTemplateProposer()
    raise UserError(f"proposer {kind!r} is not available yet; use proposer kind 'random'")
