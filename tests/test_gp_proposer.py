"""The Gaussian-process proposer (engine/proposers/gp.py, proposer kind ``gp``): the contract every proposer keeps,
that it learns from what it measured, covers a cold space before it exploits, follows its family, avoids dead ends,
weighs busy readings less, and that a search spec can name it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from proposer_fixtures import prior

from engine.evidence.lessons_projection import BUSY_READING_HALFWIDTH
from engine.problems import load_problem
from engine.proposers import ProposalContext, proposer_for
from engine.proposers.gp import (
    GaussianProcessProposer,
    GPConfig,
    _correlation,
    _cross_correlation,
    _Data,
    _distances,
    _encoding,
    _own_and_siblings,
    _Posterior,
    fit_gp,
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


def speed_of(params: dict[str, Any]) -> float:
    """A made-up landscape with an interaction: streaming stores pay only in the two-pass variant."""
    speed = 2.0 * (1.1 if params.get("ACC", 1) > 1 else 1.0)
    if params["NT"] == 1:
        speed *= 1.6 if params["FUSED"] == 0 else 0.7
    return speed


def reading(params: dict[str, Any], candidate_id: str, problem: str = "rmsnorm", **fields: Any) -> dict[str, Any]:
    return {
        "problem": problem,
        "candidate_id": candidate_id,
        "params": params,
        "n": 1,
        "log_speedup_mean": math.log(speed_of(params)),
        "log_speedup_var": 0.0,
    } | fields


def test_a_cold_search_tries_every_value_of_every_knob_before_it_exploits() -> None:
    space = problem()
    values = {f"{k}={v}" for k, vs in SPACE.items() for v in vs}
    for seed in range(6):
        settings: list[dict[str, Any]] = []
        seen: list[str] = ["seed"]
        tried: set[str] = set()
        rationales: list[str] = []
        for generation in range(1, 4):
            picks = GaussianProcessProposer().propose(
                space, context(generation, seed, lessons={"settings": settings}, seen=list(seen))
            )
            for pick in picks:
                if "exploit" in pick.rationale:
                    # Nothing is exploited before every value was tried once.
                    assert tried == values, (seed, sorted(values - tried))
                tried |= {f"{k}={v}" for k, v in pick.params.items()}
                rationales.append(pick.rationale)
                settings.append(reading(pick.params, pick.candidate_id))
                seen.append(pick.candidate_id)
        assert tried == values
        assert any("exploit-mean" in r for r in rationales), rationales
        assert all("tries untried" in r for r in rationales if r.startswith("cover")), rationales


def test_the_covering_picks_are_drawn_not_fixed() -> None:
    firsts = {
        tuple(c.candidate_id for c in GaussianProcessProposer().propose(problem(), context(1, s))) for s in range(8)
    }
    assert len(firsts) == 8


def test_a_search_its_family_informs_starts_from_the_familys_fastest_setting() -> None:
    space = problem()
    # Softmax, a sibling, measured: streaming stores pay there only in the two-pass variant, as here.
    softmax = fixed_space(load_problem("softmax"), {"FUSED": [0, 1], "NT": [0, 1], "UNROLL": [1, 2, 4, 8]})
    siblings = [reading(params, f"softmax-{i}", problem="softmax") for i, params in enumerate(template_space(softmax))]
    for seed in range(5):
        first = GaussianProcessProposer().propose(space, context(1, seed, lessons={"settings": siblings}))[0]
        assert (first.params["FUSED"], first.params["NT"]) == (0, 1)
        assert first.rationale.startswith("exploit-family")


def test_dead_ends_are_avoided_while_anything_else_is_left() -> None:
    dead = prior("NT=1", 0.5, 5, correct=0.0) | {"dead_end": True, "correct_beta": 6.0}
    for seed in range(4):
        # Known only from the priors (another search's, say): a cold search's covering picks leave it out too, once
        # every other value is covered.
        settings: list[dict[str, Any]] = []
        seen: list[str] = ["seed"]
        for generation in range(1, 5):
            lessons = {"priors": {"NT=1": dead}, "settings": settings}
            picks = GaussianProcessProposer().propose(problem(), context(generation, seed, lessons=lessons, seen=seen))
            assert picks and all(c.params["NT"] == 0 for c in picks), [c.rationale for c in picks]
            settings += [reading(c.params, c.candidate_id) for c in picks]
            seen += [c.candidate_id for c in picks]


def test_a_busy_reading_steers_it_less_than_a_quiet_one() -> None:
    space = problem()
    settings = [reading(params, f"c{i}") for i, params in enumerate(template_space(space)[::4])]
    # The first measured setting read twice as fast as it runs: quiet, or on a busy machine (a wide interval).
    spike = settings[0] | {"log_speedup_mean": settings[0]["log_speedup_mean"] + math.log(2.0)}
    quiet = spike | {"log_interval_halfwidth": 0.02}
    busy = spike | {"log_interval_halfwidth": BUSY_READING_HALFWIDTH}
    truth = settings[0]["log_speedup_mean"]
    believed = {}
    for name, first in (("quiet", quiet), ("busy", busy)):
        own, _ = _own_and_siblings(space, {"settings": [first, *settings[1:]]})
        enc = _encoding(space, template_space(space), ordinal=True)
        data = _Data(
            codes=np.array([enc.encode(p) for p, _, _ in own], dtype=np.int16),
            y=np.array([m for _, m, _ in own]),
            noise=np.array([v for _, _, v in own]),
            task=np.zeros(len(own), dtype=np.int64),
        )
        posterior = _Posterior(enc, data, fit_gp(enc, data, GPConfig()), data.codes[:1])
        believed[name] = float(posterior.mean[0])
    # A reading twice as fast as the setting runs pulls the model up; a busy one far less than a quiet one.
    assert believed["quiet"] - truth > 2 * (believed["busy"] - truth) > 0
