"""Determinism guard: saved histories of real searches replay against the current workflow code.

A change to KernelSearch that would make a running search take another path on replay fails here. Histories
are recorded by the end-to-end tests with KF_RECORD_HISTORIES=1 (see tests/search_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.kernel_search import KernelSearch

HISTORIES = sorted((Path(__file__).resolve().parent / "histories").glob("*.json"))


def test_histories_are_saved() -> None:
    assert len(HISTORIES) >= 3, "tests/histories/ should hold the saved search histories"


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_saved_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[KernelSearch], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
