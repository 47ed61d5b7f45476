"""Evidence reuse and budget exactness with the search proposer, end to end on the real Temporal dev server
and a real Postgres: a second search reuses the first one's compile and correctness evidence instead of
redoing it, and a search evaluates exactly its budget of candidates."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from search_fixtures import COPY_PROBLEM, QUICK, running_worker, start
from temporalio.client import Client

from engine.evidence.store import EventStore
from engine.search.history import STEP_EVENTS, stream_of

pytestmark = pytest.mark.slow


def artifact_files(home: Path) -> dict[str, float]:
    """Every file of the artifact cache with its modification time: a build adds or rewrites one."""
    root = home / "cache" / "artifacts"
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


async def test_a_second_search_reuses_compile_and_validation_evidence_and_budgets_are_exact(
    client: Client, store: EventStore, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_HOME", str(tmp_path))  # a private artifact cache: builds can be counted
    spec = {
        "problem": COPY_PROBLEM,
        "proposer": {"kind": "search"},
        "generations": 5,
        "candidates_per_generation": 2,
        "budget": {"max_candidates": 4},
        **QUICK,
    }
    async with running_worker(client, store, prefix):
        first = await (await start(client, prefix, spec)).result()
        built = artifact_files(tmp_path)
        # The same spec again: the same seed and (with the first search's lessons) possibly other choices;
        # whatever it proposes that the first one evaluated must not be compiled or validated again.
        second_handle = await start(client, prefix, spec)
        second = await second_handle.result()

    # Budget exact: the seed counts, duplicates never do.
    assert first.candidates_done == 4 and second.candidates_done == 4
    first_events = await store.read_stream(stream_of(first.search_id))
    second_events = await store.read_stream(stream_of(second.search_id))
    for events in (first_events, second_events):
        compiled = [e.payload["candidate_id"] for e in events if e.type == "candidate.compiled"]
        assert len(compiled) == len(set(compiled)) == 4
        steps = Counter((e.payload["candidate_id"], e.type) for e in events if e.type in STEP_EVENTS)
        assert max(steps.values()) == 1

    first_ids = {e.payload["candidate_id"] for e in first_events if e.type == "candidate.compiled"}
    shared = [e for e in second_events if e.type in STEP_EVENTS and e.payload["candidate_id"] in first_ids]
    # At least the seed kernel is shared; every shared compile and validation is reused, not redone.
    assert any(e.type == "candidate.compiled" for e in shared)
    for event in shared:
        output, evidence = event.payload["output"], event.payload["evidence"]
        if event.type == "candidate.benchmarked":
            assert not output["reused"], "a benchmark is always repeated against the incumbent of the moment"
            continue
        assert output["reused"] is True, event.event_id
        original = evidence["reused_from"]["event_id"]
        assert original.startswith(first.search_id + "/"), original
        assert original.endswith("/compiled" if event.type == "candidate.compiled" else "/validated")
    # No artifact of a shared candidate was built again (new candidates of the second search may add some).
    after = artifact_files(tmp_path)
    assert all(after.get(name) == mtime for name, mtime in built.items())
    fresh_compiles = [
        e
        for e in second_events
        if e.type == "candidate.compiled"
        and not e.payload["output"]["reused"]
        and e.payload["candidate_id"] in first_ids
    ]
    assert not fresh_compiles
