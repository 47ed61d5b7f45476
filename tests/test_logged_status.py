"""A closed search's progress as its event log tells it (engine/search/logged_status.py): the LLM spend of each
recorded proposal and the hints, the spec's and those added while it ran, add up as the workflow kept them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from engine.evidence.events import RecordedEvent
from engine.search.history import rebuild
from engine.search.logged_status import logged_status


def recorded(position: int, kind: str, payload: dict[str, Any]) -> RecordedEvent:
    return RecordedEvent(
        position=position,
        event_id=f"s/{position}",
        stream_id="search-s",
        stream_version=position,
        type=kind,
        schema_version=1,
        payload=payload,
        metadata={},
        recorded_at=datetime.now(UTC),
        prev_hash="0" * 64,
        hash="0" * 64,
    )


def test_the_log_adds_up_each_proposals_llm_spend_and_every_hint() -> None:
    spec = {
        "problem": "softmax",
        "target": "cpu-x86_64",
        "generations": 5,
        "hints": ["try streaming stores"],
        "budget": {"max_candidates": 12},
    }
    events = [
        recorded(1, "search.started", {"spec": spec}),
        recorded(2, "generation.proposed", {"generation": 1, "candidate_ids": [], "spent_usd": 0.0125}),
        recorded(3, "search.hint_added", {"text": "fuse the two passes"}),
        recorded(4, "generation.proposed", {"generation": 2, "candidate_ids": [], "spent_usd": 0.03}),
        recorded(5, "generation.proposed", {"generation": 3, "candidate_ids": [], "spent_usd": None}),
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
