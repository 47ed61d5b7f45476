"""Helpers the proposer tests share."""

from __future__ import annotations

from typing import Any

from engine.evidence.lessons import ChangePrior


def prior(change: str, advantage: float, n: float, correct: float = 10.0) -> dict[str, Any]:
    """The lessons' prior of one change (a parameter value): ``n`` outcomes, ``correct`` of them correct, each
    ``advantage`` faster than its parent in ln."""
    return ChangePrior(
        change=change,
        evidence=n,
        correct_alpha=1 + correct,
        correct_beta=1.0,
        beats_parent_alpha=1.0,
        beats_parent_beta=1.0,
        log_ratio_mean=0.0,
        log_ratio_var=0.0,
        log_ratio_n=0.0,
        log_advantage_mean=advantage,
        log_advantage_var=0.01,
        log_advantage_n=n,
        dead_end=False,
    ).model_dump(mode="json")
