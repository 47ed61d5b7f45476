"""What a problem's lessons say about its template's settings, read the same way by every model-based proposer
(the search proposer, engine/proposers/search.py, and the Gaussian-process one, engine/proposers/gp.py).

- correctness: each parameter value's Beta posterior of P(correct) from ``Lessons.priors``, and whether it is a
  dead end (never compiled or never correct);
- settled settings: those whose readings on the target already say they are slower than the incumbent, which a
  warm search leaves alone (settled_candidates);
- the family's favourites: the fastest measured settings of the problem's siblings, which a transfer search's
  exploiting picks try first, for as long as the problem's own readings of them hold up (family_holds);
- each setting's candidate id, rendered once per space.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.evidence.lessons import ChangePrior
from engine.evidence.lessons_projection import change_of
from engine.harness.verdicts import LEGACY_METHOD
from engine.problems import Problem
from engine.proposers.random_template import SpaceCache
from engine.search.candidates import candidate_id

CORRECT_PRIOR = (3.0, 1.0)
"""Beta prior of P(correct) for a template value: templates are written to be correct, mostly."""

DEAD_END_PENALTY = 25.0
"""Subtracted (in ln) from a setting with a dead-end value: last resort only."""

SETTLED_READING_SD = 0.08
"""Least spread of one reading of ln(speedup) assumed when judging whether a setting is settled (a shared
machine's readings of one kernel swing by several percent): one reading must be about 15% below the
incumbent, two about 11%, before the setting is left alone."""


@dataclass(frozen=True)
class Correctness:
    """Beta posterior of P(correct) of one parameter value, and whether it is a dead end."""

    alpha: float
    beta: float
    dead_end: bool
    evidence: float


def correctness_of(prior: ChangePrior | None) -> Correctness:
    """A value's correctness posterior from its lessons (None: the plain prior)."""
    alpha, beta = CORRECT_PRIOR
    if prior is None:
        return Correctness(alpha, beta, False, 0.0)
    return Correctness(
        alpha=alpha + prior.correct_alpha - 1.0,
        beta=beta + prior.correct_beta - 1.0,
        dead_end=prior.dead_end,
        evidence=prior.evidence,
    )


_IDS: SpaceCache[tuple[str, ...]] = SpaceCache()


def setting_ids(problem: Problem, space: list[dict[str, Any]], flags: list[str] | None) -> tuple[str, ...]:
    """The candidate id each setting of ``space`` renders to with ``flags``: rendering and hashing thousands of
    sources takes a second, done once per space and flags rather than at every proposal."""
    return _IDS.get(
        (problem.space_identity(), None if flags is None else tuple(flags)),
        lambda: tuple(candidate_id(problem.render_template(params), flags) for params in space),
    )


FAMILY_FAVOURITES = 2
"""Fastest measured settings of each other problem of the family that a transfer search's posterior-mean picks take
first (see family_favourites), while the problem has fewer than COVERING_SETTINGS measured settings of its own.
Replayed leave-one-out on this machine's five row-reduction landscapes (bench/search_quality.py, 30 cold and 15-20
transfer searches per problem; transfer score at budget 16, 0 = random search, 1 = the optimum), without the
favourites and with them, seeds 0-14: add_rmsnorm 0.71 -> 0.86, l2norm 0.02 -> 0.48, layernorm 0.46 -> 0.64,
rmsnorm 0.76 -> 0.92, softmax -0.02 -> -0.27; seeds 1000-1019: 0.77 -> 0.69, 0.20 -> 0.42, 0.75 -> 0.86, 0.92 ->
0.92, -0.15 -> -0.03 (mean over the five 0.39 -> 0.53 and 0.50 -> 0.57). Evaluations to 95% of the optimum over the
cold search's: l2norm 1.6 -> 1.3 and 1.81 -> 1.68, layernorm 1.04 -> 0.46 and 0.39 -> 0.30; the others within a
tenth. Three spreads on the upper bounds of a transfer search too (TRANSFER_UCB_KAPPA 3) scored 0.56 on the first
set, within its noise: not taken."""

COVERING_SETTINGS = 12
"""Measured settings of the problem itself after which a transfer search stops following its family's favourites
(family_holds) and, in the search proposer, the explorer's main effects are the fitted ones and a transfer search's
upper bounds take UCB_KAPPA spreads instead of TRANSFER_UCB_KAPPA (engine/proposers/search.py)."""


@dataclass(frozen=True)
class Favourite:
    """One of the fastest measured settings of another problem of the family."""

    problem: str
    params: dict[str, Any]
    behind: float
    """How far it is behind that problem's fastest measured setting, in ln(speedup) (0 for the fastest)."""
    consensus: float
    """The share of parameter values it has in common with the other problems' fastest settings (0-1)."""

    @property
    def shown(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))


def family_favourites(problem: Problem, lessons: dict[str, Any] | None) -> list[Favourite]:
    """The FAMILY_FAVOURITES fastest measured settings of each other problem of ``problem``'s family in
    ``lessons``, in the order a transfer search tries them: each problem's fastest first, then their second, ...;
    within a rank, those that share the most values with the other problems' fastest settings first (what the
    family agrees on), then the nearer their problem's fastest.

    Why: the transferred prior means (model_of) are effects a sibling's model fitted to a few readings, shrunk
    towards nothing by its empirical Bayes; replayed leave-one-out on this machine's row-reduction landscapes they
    moved hardly any effect by more than 0.05 in ln, while the siblings' fastest settings share most of their
    values with the problem's own optimum (streaming stores in the two-pass form, the pipelined loop, blocks of
    rows). A setting that ran fastest carries that directly."""
    by_problem: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for setting in (lessons or {}).get("settings") or []:
        if setting.get("problem") != problem.name and setting.get("params") and int(setting.get("n", 0)) > 0:
            by_problem[str(setting["problem"])].append(setting)
    ranked: dict[str, list[dict[str, Any]]] = {
        name: sorted(rows, key=lambda r: (-float(r["log_speedup_mean"]), str(r["candidate_id"])))
        for name, rows in sorted(by_problem.items())
    }
    bests = {name: dict(rows[0]["params"]) for name, rows in ranked.items()}
    names = set(problem.template_params)
    favourites: list[Favourite] = []
    for rank in range(FAMILY_FAVOURITES):
        tier = []
        for name, rows in ranked.items():
            if rank >= len(rows):
                continue
            params = {k: v for k, v in dict(rows[rank]["params"]).items() if k in names}
            if not params:
                continue
            others = [agreement(params, best) / len(params) for other, best in bests.items() if other != name]
            tier.append(
                Favourite(
                    problem=name,
                    params=params,
                    behind=float(rows[0]["log_speedup_mean"]) - float(rows[rank]["log_speedup_mean"]),
                    consensus=sum(others) / len(others) if others else 0.0,
                )
            )
        favourites += sorted(tier, key=lambda f: (-f.consensus, f.behind, f.problem))
    return favourites


FAVOURITE_LIKE = 0.8
"""Share of a favourite's parameter values a measured setting must share to count as a test of that favourite."""


def family_holds(
    observations: int, problem: Problem, lessons: dict[str, Any] | None, favourites: list[Favourite]
) -> bool:
    """Whether a transfer search still follows its family's favourites: while the problem has fewer than
    COVERING_SETTINGS measured settings of its own, and the fastest of those that test a favourite (share
    FAVOURITE_LIKE of its values) is at least as fast as the median of them all. A problem whose fast settings are
    not its family's (softmax among the norms) stops after its first reading of one; the mixture's weight cannot
    say so, since the family's transferred means are near zero."""
    if observations >= COVERING_SETTINGS:  # the problem's own measured settings
        return False
    own = [
        (dict(setting["params"]), float(setting["log_speedup_mean"]))
        for setting in (lessons or {}).get("settings") or []
        if setting.get("problem") == problem.name and setting.get("params") and int(setting.get("n", 0)) > 0
    ]
    tested = [
        value
        for params, value in own
        if any(agreement(params, f.params) >= FAVOURITE_LIKE * len(f.params) for f in favourites)
    ]
    return not tested or max(tested) >= float(np.median([value for _, value in own]))


def agreement(params: dict[str, Any], other: dict[str, Any]) -> int:
    """How many of ``other``'s parameter values ``params`` shares."""
    return sum(1 for k, v in other.items() if k in params and params[k] == v)


def changes_of(params: dict[str, Any]) -> set[str]:
    return {change_of(k, v) for k, v in params.items()}


def settled_candidates(
    problem: Problem,
    lessons: dict[str, Any] | None,
    incumbent_evidence: dict[str, Any] | None,
    method: int,
    machine: str | None,
) -> set[str]:
    """The candidates of ``problem`` whose evidence on the target already says they are slower than the
    incumbent: the upper end of their mean ln(speedup) (two standard errors, each reading's spread at least
    SETTLED_READING_SD and what its intervals say, see reading_var) is below the incumbent's. A warm search
    that starts from the best known kernel then spends its budget on what it has not measured instead of
    confirming what it knows; a setting measured once on a busy machine, or never clearly slower, stays
    proposable. Only readings of measurement ``method`` (today's judge's, engine/harness/verdicts.py) taken on
    ``machine`` (the search's target worker, engine/hardware.py machine_key) settle: a setting read only the old
    way, or only on another machine, is measured again; with no ``machine`` known nothing is settled."""
    speedup = (incumbent_evidence or {}).get("speedup")
    if not isinstance(speedup, int | float) or not math.isfinite(speedup) or speedup <= 0 or machine is None:
        return set()
    mark = math.log(speedup)
    settled: set[str] = set()
    for setting in (lessons or {}).get("settings") or []:
        n = int(setting.get("n", 0))
        if setting.get("problem") != problem.name or n <= 0:
            continue
        if int(setting.get("method") or LEGACY_METHOD) != method or setting.get("machine") != machine:
            continue
        # A wide or busy reading settles nothing (its width says how far off it may be).
        variance = max(float(setting.get("log_speedup_var") or 0.0), SETTLED_READING_SD**2, reading_var(setting) or 0.0)
        upper = float(setting["log_speedup_mean"]) + 2.0 * math.sqrt(variance / n)
        if upper < mark:
            settled.add(str(setting["candidate_id"]))
    return settled


def covered_values(problem: Problem, lessons: dict[str, Any] | None, incumbent: dict[str, Any] | None) -> set[str]:
    """The parameter values the problem's own evidence has tried: in a measured setting, in any candidate
    with a recorded outcome (the lessons' changes of scope ``problem``), or in the incumbent."""
    covered = changes_of(incumbent or {})
    for setting in (lessons or {}).get("settings") or []:
        if setting.get("problem") == problem.name:
            covered |= changes_of(dict(setting.get("params") or {}))
    for change in (lessons or {}).get("changes") or []:
        if change.get("scope") == "problem" and int(change.get("attempts", 0)) > 0:
            covered.add(str(change["change"]))
    return covered


def reading_var(setting: dict[str, Any]) -> float | None:
    """The variance of one reading of a setting from its benchmark intervals, when its evidence carries their
    mean half-width in ln (``log_interval_halfwidth``, at 95% confidence); None otherwise."""
    half = setting.get("log_interval_halfwidth")
    if not isinstance(half, int | float) or not math.isfinite(half) or half <= 0:
        return None
    return (float(half) / 1.96) ** 2


def change_priors(lessons: dict[str, Any] | None) -> dict[str, ChangePrior]:
    if not lessons:
        return {}
    raw = lessons.get("priors") or {}
    return {str(k): ChangePrior.model_validate(v) for k, v in raw.items()}
