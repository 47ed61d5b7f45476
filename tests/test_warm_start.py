"""Warm starts that build on what is known (issue 12 item 5): `resume_best` starts from the fastest incumbent
any earlier search of the problem and target recorded, and the search proposer leaves alone the settings
the evidence already says are slower than the incumbent, as does the Gaussian-process one (the default)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from engine.evidence.events import NewEvent
from engine.evidence.lessons_projection import BUSY_READING_HALFWIDTH
from engine.evidence.store import EventStore
from engine.harness.verdicts import CPU_MEASUREMENT_METHOD, LEGACY_METHOD
from engine.problems import load_problem
from engine.proposers import SearchProposer
from engine.proposers.base import ProposalContext, Proposer
from engine.proposers.gp import GaussianProcessProposer
from engine.proposers.random_template import template_candidate, template_space
from engine.proposers.search import settled_candidates
from engine.search.history import best_incumbent_search, latest_incumbent_search, stream_of

HERE = "machine-here"
"""The machine key of the searches' target worker in these tests."""


async def _search(store: EventStore, search_id: str, problem: str, target: str, speedups: list[float]) -> None:
    """A search's start and its promotions (each with the incumbent's recorded speedup over numpy)."""
    events = [
        NewEvent(
            event_id=f"{search_id}/started",
            type="search.started",
            payload={"spec": {"problem": problem, "target": target}},
        )
    ]
    events += [
        NewEvent(
            event_id=f"{search_id}/promoted/{i}",
            type="incumbent.promoted",
            payload={"generation": i, "incumbent": {"speedup": speedup}},
        )
        for i, speedup in enumerate(speedups)
    ]
    await store.append(stream_of(search_id), events)


async def test_resume_best_finds_the_fastest_incumbent_not_the_newest(store: EventStore) -> None:
    assert await best_incumbent_search(store, "softmax", "cpu", "new") is None
    await _search(store, "fast", "softmax", "cpu", [1.0, 3.0])
    await _search(store, "slow-later", "softmax", "cpu", [1.0, 2.0])
    await _search(store, "other-problem", "rmsnorm", "cpu", [9.0])
    await _search(store, "other-target", "softmax", "cpu-x86_64-avx2", [9.0])
    assert await latest_incumbent_search(store, "softmax", "cpu", "new") == "slow-later"
    assert await best_incumbent_search(store, "softmax", "cpu", "new") == "fast"
    # A search never starts from itself.
    assert await best_incumbent_search(store, "softmax", "cpu", "fast") == "slow-later"
    # A later search whose incumbent is faster still takes over.
    await _search(store, "faster", "softmax", "cpu", [3.5])
    assert await best_incumbent_search(store, "softmax", "cpu", "new") == "faster"


def _setting(problem: str, candidate_id: str, speedup: float, n: int, var: float = 0.0) -> dict[str, Any]:
    return {
        "problem": problem,
        "candidate_id": candidate_id,
        "params": {},
        "n": n,
        "log_speedup_mean": math.log(speedup),
        "log_speedup_var": var,
        "method": CPU_MEASUREMENT_METHOD,
        "machine": HERE,
    }


def test_only_settings_clearly_slower_than_the_incumbent_are_settled() -> None:
    problem = load_problem("softmax")
    lessons = {
        "settings": [
            _setting("softmax", "much-slower", 2.0, 1),  # one reading, 33% below: settled
            _setting("softmax", "a-bit-slower", 2.8, 1),  # one reading, 7% below: within a reading's swing
            _setting("softmax", "twice-slower", 2.65, 3),  # three agreeing readings, 12% below: settled
            _setting("softmax", "noisy", 2.65, 3, var=0.09),  # three readings 30% apart: not settled
            # One reading 33% below, but on a busy machine (its interval counts as ±40%): not settled.
            _setting("softmax", "busy", 2.0, 1) | {"log_interval_halfwidth": BUSY_READING_HALFWIDTH},
            _setting("softmax", "faster", 3.5, 4),  # faster than the incumbent: worth measuring again
            _setting("rmsnorm", "sibling", 1.0, 4),  # another problem's candidate: not this search's to skip
        ]
    }
    now = CPU_MEASUREMENT_METHOD
    assert settled_candidates(problem, lessons, {"speedup": 3.0}, now, HERE) == {"much-slower", "twice-slower"}
    # Without the incumbent's speedup (or with nonsense) nothing is settled.
    assert settled_candidates(problem, lessons, {}, now, HERE) == set()
    assert settled_candidates(problem, lessons, {"speedup": float("nan")}, now, HERE) == set()
    # Readings taken by an older measurement method (or not saying which) settle nothing for today's judge.
    older = {"settings": [s | {"method": LEGACY_METHOD} for s in lessons["settings"]]}
    assert settled_candidates(problem, older, {"speedup": 3.0}, now, HERE) == set()
    unsaid = {"settings": [{k: v for k, v in s.items() if k != "method"} for s in lessons["settings"]]}
    assert settled_candidates(problem, unsaid, {"speedup": 3.0}, now, HERE) == set()
    # Readings taken on another machine, or on one not named, settle nothing here; a search that does not know
    # its own machine settles nothing.
    assert settled_candidates(problem, lessons, {"speedup": 3.0}, now, "machine-elsewhere") == set()
    unnamed = {"settings": [s | {"machine": None} for s in lessons["settings"]]}
    assert settled_candidates(problem, unnamed, {"speedup": 3.0}, now, HERE) == set()
    assert settled_candidates(problem, lessons, {"speedup": 3.0}, now, None) == set()


@pytest.mark.parametrize("proposer", [SearchProposer(), GaussianProcessProposer()], ids=lambda p: p.name)
def test_a_warm_search_never_proposes_a_setting_its_evidence_settled(proposer: Proposer) -> None:
    problem = load_problem("kda")  # 96 settings
    space = template_space(problem)
    ids = [template_candidate(problem, p, None, proposer="search").candidate_id for p in space]
    # Every setting but eight was measured twice, well below the incumbent's 4x.
    lessons = {
        "settings": [
            {
                "problem": "kda",
                "candidate_id": cid,
                "params": params,
                "n": 2,
                "log_speedup_mean": math.log(2.0),
                "log_speedup_var": 0.0,
                "method": CPU_MEASUREMENT_METHOD,
                "machine": HERE,
            }
            for cid, params in zip(ids[8:], space[8:], strict=True)
        ]
    }
    context = ProposalContext(
        search_id="warm",
        problem="kda",
        target="cpu-test",
        machine=HERE,
        generation=1,
        count=4,
        seed=1,
        lessons=lessons,
        incumbent_evidence={"speedup": 4.0},
    )
    picks = proposer.propose(problem, context)
    assert len(picks) == 4 and {p.candidate_id for p in picks} <= set(ids[:8])
    # The same evidence read by an older measurement method settles nothing: the judge changed how it reads, so
    # the settings are worth reading again.
    older = {"settings": [s | {"method": LEGACY_METHOD} for s in lessons["settings"]]}
    picks = proposer.propose(problem, context.model_copy(update={"lessons": older}))
    assert any(p.candidate_id in set(ids[8:]) for p in picks)
    # The same evidence on new hardware settles nothing either: the search runs on another machine.
    picks = proposer.propose(problem, context.model_copy(update={"machine": "machine-new"}))
    assert any(p.candidate_id in set(ids[8:]) for p in picks)
    # The same evidence with a slower incumbent (the seed at 1.5x) settles nothing: the known 2x settings are
    # how that search catches up, so the model's best known ones come first.
    context = context.model_copy(update={"incumbent_evidence": {"speedup": 1.5}})
    picks = proposer.propose(problem, context)
    assert any(p.candidate_id in set(ids[8:]) for p in picks)
