"""A closed search's progress as its event log tells it (engine/search/logged_status.py): the LLM spend of each
recorded proposal and the hints, the spec's and those added while it ran, add up as the workflow kept them."""

from __future__ import annotations

import pytest
from lessons_fixtures import recorded_event

from engine.search.history import rebuild
from engine.search.logged_status import logged_status


def test_the_log_adds_up_each_proposals_llm_spend_and_every_hint() -> None:
    spec = {
        "problem": "softmax",
        "target": "cpu-x86_64",
        "generations": 5,
        "hints": ["try streaming stores"],
        "budget": {"max_candidates": 12},
    }
    events = [
        recorded_event(1, "search.started", {"spec": spec}),
        recorded_event(2, "generation.proposed", {"generation": 1, "candidate_ids": [], "spent_usd": 0.0125}),
        recorded_event(3, "search.hint_added", {"text": "fuse the two passes"}),
        recorded_event(4, "generation.proposed", {"generation": 2, "candidate_ids": [], "spent_usd": 0.03}),
        recorded_event(5, "generation.proposed", {"generation": 3, "candidate_ids": [], "spent_usd": None}),
    ]
    status = logged_status(rebuild("s", events), "terminated", problem=None, target=None)
    assert status.llm_spend_usd == pytest.approx(0.0425)
    assert status.hints == ["try streaming stores", "fuse the two passes"]
    assert (status.problem, status.target, status.generations, status.max_candidates) == (
        "softmax",
        "cpu-x86_64",
        5,
        12,
    )
    assert status.from_log and status.status == "terminated" and status.candidates_done == 0
    assert status.best_speedup is None and status.incumbent is None
