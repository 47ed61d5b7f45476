"""The search proposer: no repeats, deterministic per seed, steered by lessons (no database needed)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine.lessons import ChangePrior
from engine.problems import load_problem
from engine.proposers import ProposalContext, proposer_for
from engine.proposers.random_template import template_candidate, template_space
from engine.proposers.search import SearchProposer
from engine.search.candidates import Candidate


def context(generation: int = 1, seed: int = 0, **fields: Any) -> ProposalContext:
    return ProposalContext(
        search_id="s", problem="softmax", target="cpu-test", generation=generation, count=4, seed=seed, **fields
    )


def prior(change: str, advantage: float, n: float, correct: float = 10.0) -> dict[str, Any]:
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


def test_registered_as_search() -> None:
    assert isinstance(proposer_for("search"), SearchProposer)


def test_never_proposes_a_candidate_twice_and_exhausts_the_space() -> None:
    problem = load_problem("softmax")
    proposer = SearchProposer()
    seen: list[str] = []
    incumbent: Candidate | None = None
    for generation in range(1, 20):
        picks = proposer.propose(problem, context(generation, incumbent=incumbent, seen=list(seen)))
        if not picks:
            break
        assert len({c.candidate_id for c in picks}) == len(picks)
        assert not {c.candidate_id for c in picks} & set(seen)
        assert all(c.proposer == "search" and c.rationale for c in picks)
        seen += [c.candidate_id for c in picks]
        assert all(c.parent_id == (incumbent.candidate_id if incumbent else None) for c in picks)
        incumbent = picks[0]
    assert len(seen) == len(set(seen)) == len(template_space(problem))


def test_deterministic_per_seed_and_generation() -> None:
    problem = load_problem("rmsnorm")
    proposer = SearchProposer()
    ids = [[c.candidate_id for c in proposer.propose(problem, context(2, seed))] for seed in (1, 1, 2)]
    assert ids[0] == ids[1]
    assert ids[0] != ids[2]
    next_generation = [c.candidate_id for c in proposer.propose(problem, context(3, 1))]
    assert next_generation != ids[0]


def test_exploits_the_incumbents_neighbourhood() -> None:
    problem = load_problem("rmsnorm")
    params = {"ACC": 4, "ROWS": 2, "SIMD": 0, "FUSED": 1, "VEC": 256, "NT": 0}
    incumbent = template_candidate(problem, params, None, proposer="search")
    picks = SearchProposer().propose(problem, context(1, 3, incumbent=incumbent))
    distances = [sum(p.params[k] != v for k, v in params.items()) for p in picks]
    # Every other pick, starting with the first, changes one or two of the incumbent's parameters.
    assert all(1 <= d <= 2 for d in distances[::2])
    assert all(p.parent_id == incumbent.candidate_id for p in picks)
    assert "exploit" in picks[0].rationale


def test_lessons_change_its_choices() -> None:
    problem = load_problem("softmax")
    proposer = SearchProposer()
    lessons = {"priors": {"UNROLL=8": prior("UNROLL=8", 0.5, 20), "UNROLL=1": prior("UNROLL=1", -0.3, 20)}}
    without: Counter[int] = Counter()
    informed: Counter[int] = Counter()
    for seed in range(30):
        for c in proposer.propose(problem, context(1, seed)):
            without[c.params["UNROLL"]] += 1
        for c in proposer.propose(problem, context(1, seed, lessons=lessons)):
            informed[c.params["UNROLL"]] += 1
    total = sum(without.values())
    # Without lessons UNROLL=8 is one of four values; with lessons saying it is great, it dominates.
    assert without[8] < total / 2
    assert informed[8] >= 2 * without[8]
    assert informed[8] >= total / 2
    assert informed[1] < without[1]


def test_dead_ends_are_avoided_while_anything_else_is_left() -> None:
    problem = load_problem("softmax")
    dead = prior("SIMD=1", 0.5, 5, correct=0.0) | {"dead_end": True, "correct_beta": 6.0}
    lessons = {"priors": {"SIMD=1": dead}}
    picks = [c for seed in range(10) for c in SearchProposer().propose(problem, context(1, seed, lessons=lessons))]
    assert picks and all(c.params["SIMD"] == 0 for c in picks)
