"""The search proposer: the offline default. Thompson sampling over a problem's template parameters,
with lessons as priors. No network, no key.

Belief model: a setting's worth is the sum of the effects of its parameter values (their main effects,
in ln of speedup) plus, for each value, ln P(correct). Each generation, every pick draws one sample of
every value's effect and correctness from its posterior and takes the best setting under that draw
(Thompson sampling): values the evidence says are good are drawn high often, uncertain ones sometimes,
so the search exploits and explores in proportion to what it does not know.

- Effects: prior N(0, EFFECT_PRIOR_SD²); evidence from ``Lessons.priors`` — the log-advantage of the
  value (how much faster candidates carrying it ran than their problem's average), or its log-speedup
  over the parent when no advantage is known. Lessons already weigh the problem's own evidence above
  its family's, and include this search's earlier generations (lessons_for catches the log up).
- Correctness: Beta(CORRECT_PRIOR) updated with the value's recorded successes and failures; a dead end
  (never compiled or never correct) is proposed only when nothing else is left.
- Exploitation around the incumbent: every other pick (the first included) is taken among the incumbent's
  neighbours, the settings that change one or two of its parameters; the others from the whole space.
- A hedge: every fourth pick is uniform over the settings that are not dead ends, because a sum of main
  effects misses parameters that only pay together, and the search must still stumble on those.

Randomness derives from (seed, generation), so the same context proposes the same candidates; a candidate
in ``context.seen`` is never proposed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.lessons import ChangePrior
from engine.lessons_projection import change_of
from engine.problems import Problem
from engine.proposers.base import ProposalContext
from engine.proposers.random_template import template_candidate, template_space
from engine.search.candidates import Candidate

EFFECT_PRIOR_SD = 0.3
"""Prior spread of a parameter value's effect, in ln(speedup): most values change speed by < 35%."""

SAMPLE_SD_FLOOR = 0.05
"""Least spread assumed for one measurement of an effect (timing noise), in ln(speedup)."""

CORRECT_PRIOR = (3.0, 1.0)
"""Beta prior of P(correct) for a template value: templates are written to be correct, mostly."""

DEAD_END_PENALTY = 25.0
"""Subtracted (in ln) from a setting with a dead-end value: last resort only."""

NEIGHBOURHOOD = 2
"""Most parameters an exploiting pick changes relative to the incumbent."""

UNIFORM_EVERY = 4
"""Every fourth pick is uniform among the settings that are not dead ends (a hedge against the model)."""


@dataclass(frozen=True)
class _Belief:
    """Posterior of one parameter value: effect N(mean, sd²), correctness Beta(alpha, beta)."""

    mean: float
    sd: float
    alpha: float
    beta: float
    dead_end: bool
    evidence: float


def belief_of(prior: ChangePrior | None) -> _Belief:
    """A value's posterior from its lessons (None: the plain prior)."""
    alpha, beta = CORRECT_PRIOR
    if prior is None:
        return _Belief(0.0, EFFECT_PRIOR_SD, alpha, beta, False, 0.0)
    if prior.log_advantage_n > 0:
        n, mean, var = prior.log_advantage_n, prior.log_advantage_mean, prior.log_advantage_var
    else:
        n, mean, var = prior.log_ratio_n, prior.log_ratio_mean, prior.log_ratio_var
    precision = 1.0 / EFFECT_PRIOR_SD**2
    if n > 0:
        # Normal-normal update: n measurements of spread s around the value's true effect.
        noise = max(var, SAMPLE_SD_FLOOR**2)
        posterior_var = 1.0 / (precision + n / noise)
        posterior_mean = posterior_var * (n * mean / noise)
    else:
        posterior_var, posterior_mean = 1.0 / precision, 0.0
    return _Belief(
        mean=posterior_mean,
        sd=math.sqrt(posterior_var),
        alpha=alpha + prior.correct_alpha - 1.0,
        beta=beta + prior.correct_beta - 1.0,
        dead_end=prior.dead_end,
        evidence=prior.evidence,
    )


@dataclass(frozen=True)
class _Option:
    params: dict[str, Any]
    candidate: Candidate


def _distance(a: dict[str, Any], b: dict[str, Any]) -> int:
    return sum(a.get(k) != v for k, v in b.items()) + sum(k not in b for k in a)


class SearchProposer:
    """Thompson sampling over the template's parameter values, exploiting around the incumbent."""

    name = "search"

    def propose(self, problem: Problem, context: ProposalContext) -> list[Candidate]:
        space = template_space(problem)
        if not space or context.count <= 0:
            return []
        seen = set(context.seen)
        parent_id = context.incumbent.candidate_id if context.incumbent else None
        fresh = [
            option
            for option in (
                _Option(
                    params,
                    template_candidate(problem, params, context.flags, proposer=self.name, parent_id=parent_id),
                )
                for params in space
            )
            if option.candidate.candidate_id not in seen
        ]
        priors = _priors(context.lessons)
        values = sorted({change_of(k, v) for params in space for k, v in params.items()})
        beliefs = {value: belief_of(priors.get(value)) for value in values}
        incumbent = dict(context.incumbent.params) if context.incumbent and context.incumbent.params else None
        rng = np.random.default_rng([context.seed, context.generation])
        picks: list[Candidate] = []
        for index in range(context.count):
            if not fresh:
                break
            neighbours = [o for o in fresh if 1 <= _distance(o.params, incumbent) <= NEIGHBOURHOOD] if incumbent else []
            exploit = bool(neighbours) and index % 2 == 0
            pool = neighbours if exploit else fresh
            # One Thompson draw per pick: every value's effect and ln P(correct), sampled together.
            effect = {v: b.mean + b.sd * float(rng.standard_normal()) for v, b in beliefs.items()}
            correct = {v: math.log(max(float(rng.beta(b.alpha, b.beta)), 1e-12)) for v, b in beliefs.items()}
            scored = [(self._score(o.params, effect, correct, beliefs), i) for i, o in enumerate(pool)]
            if index % UNIFORM_EVERY == UNIFORM_EVERY - 1:
                # The model adds up main effects; parameters that only pay together (non-temporal stores
                # with the two-pass variant) escape it. A uniform pick among the settings that are not dead
                # ends keeps sampling what the model would never rank first.
                alive = [t for t in scored if t[0] > -DEAD_END_PENALTY / 2] or scored
                score, best = alive[int(rng.integers(len(alive)))]
                exploit = False
                mode = "uniform"
            else:
                score, best = max(scored, key=lambda t: (t[0], -t[1]))
                mode = "exploit" if exploit else "explore"
            chosen = pool[best]
            fresh.remove(chosen)
            rationale = self._rationale(chosen.params, incumbent, mode, score, beliefs)
            picks.append(chosen.candidate.model_copy(update={"rationale": rationale}))
        return picks

    @staticmethod
    def _score(
        params: dict[str, Any], effect: dict[str, float], correct: dict[str, float], beliefs: dict[str, _Belief]
    ) -> float:
        total = 0.0
        for name, value in params.items():
            change = change_of(name, value)
            total += effect[change] + correct[change]
            if beliefs[change].dead_end:
                total -= DEAD_END_PENALTY
        return total

    @staticmethod
    def _rationale(
        params: dict[str, Any],
        incumbent: dict[str, Any] | None,
        mode: str,
        score: float,
        beliefs: dict[str, _Belief],
    ) -> str:
        informed = sum(b.evidence > 0 for b in beliefs.values())
        source = f"lessons on {informed} of {len(beliefs)} values" if informed else "no lessons yet"
        if mode == "exploit" and incumbent is not None:
            moves = ", ".join(f"{k} {incumbent.get(k)}→{v}" for k, v in sorted(params.items()) if incumbent.get(k) != v)
            return f"exploit: the incumbent with {moves}; Thompson draw {score:+.2f} ({source})"
        setting = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
        if mode == "uniform":
            return f"explore: a uniform pick, {setting}, beyond what the main-effect model ranks first ({source})"
        return f"explore: Thompson draw over the template space chose {setting} ({score:+.2f}; {source})"


def _priors(lessons: dict[str, Any] | None) -> dict[str, ChangePrior]:
    if not lessons:
        return {}
    raw = lessons.get("priors") or {}
    return {str(k): ChangePrior.model_validate(v) for k, v in raw.items()}
