"""The Temporal UI as the operator's console, and the progress `kf search … --wait` prints.

A real small search on the dev server: its static summary and details (set by `start_search`) come back from
the client's describe, and its current details -- what the UI shows on the workflow's page, answered by the SDK's
built-in `__temporal_workflow_metadata` query -- follow it while it runs and after it ends. The follower's
progress lines never count past the generations asked for, and its last line agrees with the result.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import pytest
from search_fixtures import QUICK, running_worker
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client

from activities.search_client import start_search
from cli.search import final_status, follow, progress_line
from engine.evidence.store import EventStore
from engine.search.candidates import Candidate
from engine.search.console import current_details, static_details, summary
from engine.search.spec import SearchSpec
from engine.search.state import CandidateOutcome, Incumbent, SearchResult, SearchState, SearchStatus

METADATA_QUERY = "__temporal_workflow_metadata"
"""The SDK's built-in query the Web UI asks for a workflow's current details."""
NOW = datetime(2025, 1, 1, tzinfo=UTC)


def _state(**fields: object) -> SearchState:
    spec = SearchSpec(problem="softmax", generations=2, budget={"max_candidates": 12, "max_wall_minutes": 60})
    return SearchState(search_id="s", spec=spec, started_at=NOW, **fields)


def _incumbent() -> Incumbent:
    candidate = Candidate.create("int k;", ["-O3"], label="template NT=4", params={"NT": 4}, proposer="search")
    return Incumbent(candidate=candidate, artifact_id="a", speedup=3.5, ci_low=3.1, ci_high=3.9, generation=1)


def _status(**fields: object) -> SearchStatus:
    base: dict[str, object] = {
        "search_id": "s",
        "problem": "softmax",
        "target": "cpu",
        "target_queue": "kf-cpu",
        "status": "running",
        "generation": 1,
        "generations": 1,
        "candidates_done": 2,
        "verdict_counts": {"ok": 2},
        "best_speedup": 2.0,
        "best_ci_low": 1.9,
        "best_ci_high": 2.1,
        "incumbent": "seed (abc)",
        "incumbent_id": "abc",
        "llm_spend_usd": 0.0,
        "hints": [],
    }
    return SearchStatus.model_validate(base | fields)


def test_the_generation_shown_never_passes_the_generations_asked_for() -> None:
    # `generation` is the next one to run: N+1 once the last of N has run, which the progress once printed.
    assert _state(generation=0).current_generation == 0
    assert _state(generation=2).current_generation == 2
    assert _state(generation=3).current_generation == 2  # between the last generation and the finished record
    assert _state(generation=3, status="completed").current_generation == 2
    assert _state(generation=2, status="stopped").current_generation == 1  # stopped before generation 2 ran
    assert _state(stop_requested=True).phase == "stopping"
    assert _state(paused=True).phase == "paused"


def test_the_progress_line_shows_the_incumbent_with_its_interval_and_a_faster_candidate_awaiting_promotion() -> None:
    line = progress_line(_status())
    assert "generation 1/1" in line and "best 2.000x [1.900, 2.100] vs numpy" in line
    assert "fastest this generation" not in line
    ahead = progress_line(_status(leading_speedup=2.5, leading="t (def)"))
    assert "fastest this generation 2.500x (promotion decided at its end)" in ahead
    assert "fastest" not in progress_line(_status(leading_speedup=1.5))  # behind the incumbent: nothing to say


def test_the_progress_line_says_the_step_under_way_and_a_bar_of_the_budget() -> None:
    line = progress_line(_status(step="compiling 1 · benchmarking 2", max_candidates=8, candidates_done=4))
    assert line.startswith("[running] ▕█████·····▏ generation 1/1 · compiling 1 · benchmarking 2 · 4 candidates")
    # Without a candidate limit the bar counts generations (generation 0 is the seed's).
    assert progress_line(_status(generation=2, generations=3)).startswith("[running] ▕█████·····▏")
    # A step is only said while the search runs.
    assert "compiling" not in progress_line(_status(status="completed", step="compiling 1"))


def test_the_last_progress_line_is_the_result() -> None:
    candidate = Candidate.create("int k;", None, label="template NT=8", proposer="search")
    result = SearchResult(
        search_id="s",
        status="completed",
        best_speedup=2.6,
        best_ci_low=2.5,
        best_ci_high=2.7,
        incumbent=candidate,
        candidates_done=3,
        verdict_counts={"ok": 3},
        generations_run=2,
    )
    line = progress_line(final_status(_status(leading_speedup=2.6), result))
    assert line.startswith("[completed] ▕██████████▏ generation 1/1 · 3 candidates · ok=3")
    assert "best 2.600x [2.500, 2.700]" in line and "fastest" not in line


def test_current_details_say_generation_incumbent_interval_verdicts_and_budget_left() -> None:
    state = _state(
        generation=1,
        incumbent=_incumbent(),
        evaluated=["a", "b", "c", "d", "e"],
        verdict_counts={"ok": 4, "compile_error": 1},
    )
    leading = CandidateOutcome(candidate_id="f" * 64, label="template NT=8", verdict="ok", speedup=4.2)
    text = current_details(state, NOW + timedelta(minutes=15), leading)
    assert text.startswith("**Generation 1 of 2** · running")
    assert "`template NT=4`" in text and "`NT=4 · flags -O3`" in text
    assert "3.500× vs numpy [3.100, 3.900] at 95%" in text
    assert "5 judged (compile_error 1 · ok 4)" in text
    assert "1 more generation · 7 of 12 candidates · 45 of 60 min" in text
    assert "Fastest this generation:** 4.200×" in text
    assert "no correct candidate" in current_details(_state(), NOW)
    assert "Busy machine" not in text
    busy = current_details(state.model_copy(update={"timings": 6, "busy_timings": 2}), NOW)
    assert "- **Busy machine:** 2 of 6 timings ran while other work used their cores" in busy
    assert "- **Budget:** 12 candidates, 60 min" in static_details(state.spec)
    assert (
        summary(state.spec) == "softmax on cpu: 2 generations × 4 candidates, budget 12 candidates, 60 min, proposer gp"
    )


@pytest.mark.slow
async def test_the_ui_shows_a_real_searchs_summary_and_current_details_during_and_after(
    client: Client, store: EventStore, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = SearchSpec.model_validate(
        {"problem": "softmax", "generations": 1, "candidates_per_generation": 1, "task_queue_prefix": prefix, **QUICK}
    )
    async with running_worker(client, store, prefix):
        handle = await start_search(client, spec)
        following = asyncio.ensure_future(follow(client, handle.id, as_json=False))
        seen: list[str] = []
        steps: set[str] = set()
        while not following.done():
            try:
                metadata = await handle.query(METADATA_QUERY, result_type=WorkflowMetadata)
            except Exception:  # the first workflow task has not run yet
                metadata = None
            if metadata is not None and metadata.current_details and metadata.current_details not in seen:
                seen.append(metadata.current_details)
            if metadata is not None:
                steps.add((await handle.query("status", result_type=SearchStatus)).step)
            await asyncio.sleep(0.2)
        assert await following == 0
        result = await handle.result()
        after = await handle.query(METADATA_QUERY, result_type=WorkflowMetadata)
        description = await handle.describe()
    assert result.status == "completed" and result.best_speedup is not None

    # The status query said which step was under way: the seed's compile, validation and timing, then the
    # proposal of generation 1 and its candidate's steps (polled, so a short step may be missed, not all).
    assert len(steps & {"compiling 1", "validating 1", "benchmarking 1", "proposing 1 candidate"}) >= 2, steps
    assert result.best_roofline_fraction is not None and 0 < result.best_roofline_fraction
    # While it ran: the generation of how many, what it was doing, and the incumbent once there was one.
    assert any(d.startswith("**Generation 0 of 1** · running") for d in seen), seen
    assert any("**Best speedup:**" in d and "vs numpy [" in d for d in seen), seen
    # After: the closed search, replayed to answer, says how it ended and with what.
    final = after.current_details
    assert final.startswith("**Generation 1 of 1** · completed"), final
    assert f"{result.best_speedup:.3f}× vs numpy [{result.best_ci_low:.3f}, {result.best_ci_high:.3f}]" in final
    assert f"{result.candidates_done} judged" in final
    assert await description.static_summary() == summary(spec)
    assert "Steer it with an *Update*" in (await description.static_details() or "")

    # The follower's progress, on stderr (stdout carries the result alone): never "generation 2/1"; its last
    # line is the result's.
    captured = capsys.readouterr()
    out = captured.err
    assert not [line for line in captured.out.splitlines() if line.startswith("[")], captured.out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    generations = [int(g) for g in re.findall(r"generation (\d+)/1", out)]
    assert generations and max(generations) == 1, out
    assert lines[-1].startswith("[completed] ▕██████████▏ generation 1/1"), out
    assert f"{result.best_roofline_fraction:.1%} of the roofline" in captured.err + captured.out, captured
    assert f"best {result.best_speedup:.3f}x" in lines[-1], out
