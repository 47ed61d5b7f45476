"""The Gaussian-process proposer (engine/proposers/gp.py, proposer kind ``gp``): the contract every proposer keeps,
that it learns from what it measured, and that a search spec can name it."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.problems import load_problem
from engine.proposers import ProposalContext, proposer_for
from engine.proposers.gp import (
    GaussianProcessProposer,
    GPConfig,
    _correlation,
    _cross_correlation,
    _distances,
    _encoding,
)
from engine.proposers.random_template import template_space
from engine.replay.simulation import RecordedSpace, fixed_space
from engine.search.candidates import Candidate
from engine.search.spec import SearchSpec

SPACE: dict[str, list[Any]] = {
    "ACC": [1, 4, 8, 16],
    "ROWS": [1, 2, 4],
    "FUSED": [0, 1],
    "VEC": [256, 512],
    "NT": [0, 1],
}


def problem() -> RecordedSpace:
    return fixed_space(load_problem("rmsnorm"), SPACE)


def context(generation: int = 1, seed: int = 0, **fields: Any) -> ProposalContext:
    return ProposalContext(
        search_id="s", problem="rmsnorm", target="cpu-test", generation=generation, count=4, seed=seed, **fields
    )


def test_never_proposes_a_candidate_twice_and_exhausts_the_space() -> None:
    space = problem()
    proposer = GaussianProcessProposer()
    seen: list[str] = []
    incumbent: Candidate | None = None
    for generation in range(1, 40):
        picks = proposer.propose(space, context(generation, incumbent=incumbent, seen=list(seen)))
        if not picks:
            break
        assert not {c.candidate_id for c in picks} & set(seen)
        assert len({c.candidate_id for c in picks}) == len(picks)
        seen += [c.candidate_id for c in picks]
        incumbent = picks[0]
    assert len(seen) == len(template_space(space))


def test_deterministic_per_seed_and_generation() -> None:
    space = problem()
    ids = [[c.candidate_id for c in GaussianProcessProposer().propose(space, context(1, s))] for s in (1, 1, 2)]
    assert ids[0] == ids[1] != ids[2]


def test_exploits_what_it_measured_fast() -> None:
    """With NT=1 and FUSED=0 read fast and everything else slow, the posterior-mean pick has both."""
    space = problem()
    settings = []
    for i, params in enumerate(template_space(space)[::3]):
        fast = params["NT"] == 1 and params["FUSED"] == 0
        settings.append(
            {
                "problem": "rmsnorm",
                "params": params,
                "n": 1,
                "log_speedup_mean": 1.0 if fast else 0.0,
                "candidate_id": f"c{i}",
            }
        )
    picks = GaussianProcessProposer().propose(
        space, context(5, lessons={"settings": settings}, seen=[s["candidate_id"] for s in settings])
    )
    assert picks[0].params["NT"] == 1 and picks[0].params["FUSED"] == 0


def test_the_knob_by_knob_correlation_is_the_one_the_fit_uses() -> None:
    space = problem()
    enc = _encoding(space, template_space(space), ordinal=True)
    theta = np.linspace(0.1, 2.0, len(enc.knobs))
    for mix in (*GPConfig().mix_grid, (0.0, 0.0, 1.0), (0.5, 0.2, 0.3)):
        direct = _correlation(_distances(enc.codes[:7], enc.codes[:5], enc), theta, mix)
        assert np.allclose(direct, _cross_correlation(enc.codes[:7], enc.codes[:5], enc, theta, mix))
        assert np.allclose(np.diag(_correlation(_distances(enc.codes, enc.codes, enc), theta, mix)), 1.0)


def test_a_search_spec_names_it_and_gets_it() -> None:
    spec = SearchSpec.model_validate({"problem": "softmax", "proposer": {"kind": "gp"}})
    assert isinstance(proposer_for(spec.proposer.kind), GaussianProcessProposer)
