"""The promotion rule: a candidate replaces the incumbent only when it is faster beyond the margin with
confidence — the lower end of its speedup interval over the incumbent clears ``1 + margin``.

An A/A comparison has an interval around 1.0, so a kernel never promotes over itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.search.spec import PromotionPolicy
from engine.search.state import CandidateOutcome, Incumbent


class Reading(Protocol):
    """A timed reading over the incumbent: a candidate's outcome, or a re-measurement's step output."""

    @property
    def verdict(self) -> str: ...

    @property
    def ratio_ci_low(self) -> float | None: ...


def clears_margin(outcome: Reading, policy: PromotionPolicy) -> bool:
    """True when the reading is correct and its ratio's lower bound is above ``1 + margin``."""
    return outcome.verdict == "ok" and outcome.ratio_ci_low is not None and outcome.ratio_ci_low > 1.0 + policy.margin


def shaky(outcome: CandidateOutcome, policy: PromotionPolicy) -> bool:
    """True when the reading must be re-measured before it promotes: timed on shared cores, or the relative
    half-width of its ratio's interval is above ``policy.confirm_halfwidth`` (or unknown)."""
    if outcome.shared_cores:
        return True
    if outcome.ratio is None or outcome.ratio_ci_low is None or outcome.ratio_ci_high is None or outcome.ratio <= 0:
        return True
    return (outcome.ratio_ci_high - outcome.ratio_ci_low) / (2 * outcome.ratio) > policy.confirm_halfwidth


def readings_to_remeasure(outcomes: Sequence[CandidateOutcome], policy: PromotionPolicy) -> list[CandidateOutcome]:
    """The generation's shaky readings to re-measure before anything uses them: the ``steering_remeasures``
    fastest (by ratio over the incumbent; ties by id) among the correct, timed and shaky ones."""
    candidates = [o for o in outcomes if o.verdict == "ok" and o.ratio is not None and shaky(o, policy)]
    candidates.sort(key=lambda o: (-(o.ratio or 0.0), o.candidate_id))
    return candidates[: policy.steering_remeasures]


def choose_promotion(outcomes: Sequence[CandidateOutcome], policy: PromotionPolicy) -> CandidateOutcome | None:
    """The candidate to promote from one generation, or None.

    Every candidate of a generation was timed against the same incumbent, so their ratios compare; among
    those that clear the margin the highest lower bound wins (ties: the higher ratio, then the id, so the
    choice is deterministic).
    """
    eligible = [o for o in outcomes if clears_margin(o, policy)]
    if not eligible:
        return None
    return max(eligible, key=lambda o: (o.ratio_ci_low or 0.0, o.ratio or 0.0, o.candidate_id))


def could_beat(outcome: CandidateOutcome, incumbent: Incumbent, head_to_head: bool = True) -> bool:
    """True when a correct, timed ``outcome`` is not known to be slower than ``incumbent``: a challenger for the
    final playoff. Either its speedup interval over numpy reaches the incumbent's lower end, or (with
    ``head_to_head``; without it is the rule of histories recorded before) it was timed head to head against
    this incumbent and its ratio's interval reaches 1. The head-to-head ratio is the sturdier figure: two
    speedups over numpy come from different runs, and numpy's own timing drifts between them (a copy kernel
    timed 1.00x [0.98, 1.04] against the incumbent read 0.268x numpy against the incumbent's 0.286x
    [0.279, 0.294])."""
    if outcome.verdict != "ok" or outcome.artifact_id is None:
        return False
    if (outcome.speedup_ci_high or outcome.speedup or 0.0) >= incumbent.ci_low:
        return True
    if not head_to_head:
        return False
    ratio_high = outcome.ratio_ci_high if outcome.ratio_ci_high is not None else outcome.ratio
    return outcome.timed_against == incumbent.artifact_id and ratio_high is not None and ratio_high >= 1.0
