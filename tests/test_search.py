"""KernelSearch end to end on the real Temporal dev server and a real Postgres.

The workers run in this process (except in the crash test, which kills real worker processes); the kernels
run in the harness's sandboxed child processes as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from search_fixtures import COPY_PROBLEM, QUICK, forget, keep_history, running_worker, start
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from activities.search_client import list_searches, queried_status, search_status, status_from_log_alone
from cli import exit_status
from cli.search import progress_line
from engine.evidence.store import EventStore
from engine.hardware import machine_key
from engine.harness.backend import backend_for
from engine.harness.evaluation import validate_artifact
from engine.harness.verdicts import CPU_MEASUREMENT_METHOD
from engine.problems import load_problem
from engine.search.audit import audit_search, format_audit
from engine.search.candidates import Candidate
from engine.search.history import STEP_EVENTS, load_search_history, stream_of
from engine.search.promotion import choose_promotion, could_beat, readings_to_remeasure, shaky
from engine.search.spec import PromotionPolicy
from engine.search.state import CandidateOutcome, Incumbent, SearchResult, SearchStatus

pytestmark = pytest.mark.slow


def assert_complete_record(events: list[Any], result: SearchResult) -> None:
    """Each evaluated candidate has exactly one outcome per step it reached, and versions are contiguous."""
    versions = [e.stream_version for e in events]
    assert versions == list(range(1, len(events) + 1))
    positions = [e.position for e in events]
    assert positions == sorted(positions)
    steps = Counter((e.payload["candidate_id"], e.type) for e in events if e.type in STEP_EVENTS)
    assert steps and max(steps.values()) == 1, f"a step was recorded twice: {steps.most_common(3)}"
    compiled = {cid for cid, t in steps if t == "candidate.compiled"}
    assert len(compiled) == result.candidates_done
    for cid, step in steps:
        if step == "candidate.benchmarked":
            assert (cid, "candidate.validated") in steps
        if step == "candidate.validated":
            assert (cid, "candidate.compiled") in steps
    types = [e.type for e in events]
    assert types[0] == "search.started" and types[-1] == "search.finished"


async def assert_list_agrees_with_show(client: Client, search_id: str, generation: int | None = None) -> None:
    """`kf search list` (the Generation search attribute) names the generation `kf search show` (the status query)
    does for an ended search -- the last one run (``generation`` when given), not the next it would have run."""
    shown = await search_status(client, search_id)  # read from the result, which keeps the progress it ended at
    assert generation is None or shown.generation == generation, shown
    asked = await queried_status(client, search_id)  # the workflow's own answer, replayed by the worker
    assert shown == asked.model_copy(update={"step": "", "leading_speedup": None, "leading": None}), (shown, asked)
    deadline = asyncio.get_running_loop().time() + 30
    while True:  # Temporal's list (its visibility store) catches up with a closed workflow a moment later
        row = next((r for r in await list_searches(client, limit=1000) if r["search_id"] == search_id), None)
        if (row is not None and row["status"] != "running") or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert row is not None and row["generation"] == shown.generation, (row, shown.generation)


async def test_two_generation_search_records_everything_and_promotes_only_on_confidence(
    client: Client, store: EventStore, prefix: str, fresh_db_url: str
) -> None:
    async with running_worker(client, store, prefix):
        handle = await start(
            client, prefix, {"problem": "softmax", "generations": 2, "candidates_per_generation": 2, **QUICK}
        )
        result = await handle.result()
        await assert_list_agrees_with_show(client, handle.id, 2)  # the status query needs the worker
    await keep_history(handle, "two_generations")

    assert result.status == "completed"
    assert result.generations_run == 3  # the seed's generation 0, then two
    assert result.incumbent is not None and result.best_speedup is not None
    events = await store.read_stream(stream_of(handle.id))
    assert_complete_record(events, result)
    assert await store.verify(stream_of(handle.id)) is None
    # No seed given: the search drew one and recorded it, so it can be repeated with --seed.
    started = next(e for e in events if e.type == "search.started")
    assert isinstance(started.payload["spec"]["seed"], int) and 0 <= started.payload["spec"]["seed"] < 2**32

    history = await load_search_history(store, handle.id)
    assert history.incumbent is not None
    assert history.incumbent.candidate.candidate_id == result.incumbent.candidate_id
    margin = 0.02
    for promotion in history.promotions[1:]:
        # After the first incumbent, a promotion needs the interval's lower end above 1 + margin; the final
        # playoff's needs it above 1 (no margin: nothing is left to explore).
        playoff = promotion["reason"].startswith("won the final playoff")
        assert promotion["ratio_ci_low"] > (1 if playoff else 1 + margin), promotion
    # The incumbent is correct: validate its artifact afresh with other seeds.
    problem = load_problem("softmax")
    report = await asyncio.to_thread(validate_artifact, problem, history.incumbent.artifact_id, base_seed=991)
    assert report.verdict == "ok"
    # Every outcome carries the Temporal ids that wrote it.
    compiled = next(e for e in events if e.type == "candidate.compiled")
    assert compiled.metadata["workflow_id"] == handle.id
    assert compiled.metadata["attempt"] >= 1 and compiled.metadata["activity_id"]
    assert compiled.metadata["worker"] == f"test-worker-{prefix}"
    assert compiled.metadata["hardware"]["cpu_model"]
    # Once Temporal no longer holds it (retention), `kf search show` reads how it ended from the event log alone.
    alone = await status_from_log_alone(fresh_db_url, handle.id)
    assert alone is not None and alone.status == "completed" and alone.from_log, alone
    assert (alone.candidates_done, alone.incumbent_id) == (result.candidates_done, result.incumbent.candidate_id)
    assert alone.best_speedup == result.best_speedup and alone.generation == 2
    assert await status_from_log_alone(fresh_db_url, f"{handle.id}-never") is None


def test_a_reading_is_shaky_when_its_interval_is_wide_or_its_cores_were_shared() -> None:
    policy = PromotionPolicy(confirm_halfwidth=0.05)

    def outcome(ratio: float, low: float, high: float, shared: bool = False) -> CandidateOutcome:
        return CandidateOutcome(
            candidate_id="c",
            label="c",
            verdict="ok",
            ratio=ratio,
            ratio_ci_low=low,
            ratio_ci_high=high,
            shared_cores=shared,
        )

    assert not shaky(outcome(2.0, 1.95, 2.05), policy)  # half-width 2.5%
    assert shaky(outcome(4.18, 3.40, 5.19), policy)  # the load spike that once steered a search
    assert shaky(outcome(2.0, 1.95, 2.05, shared=True), policy)  # a busy machine, however narrow
    assert shaky(CandidateOutcome(candidate_id="c", label="c", verdict="ok", ratio=2.0), policy)  # no interval
    assert shaky(outcome(2.0, 1.95, 2.05), PromotionPolicy(confirm_halfwidth=0.0))  # 0: every promotion


def test_the_fastest_shaky_readings_are_the_ones_re_measured() -> None:
    def reading(cid: str, ratio: float, spread: float, verdict: str = "ok") -> CandidateOutcome:
        return CandidateOutcome(
            candidate_id=cid,
            label=cid,
            verdict=verdict,
            ratio=ratio,
            ratio_ci_low=ratio * (1 - spread),
            ratio_ci_high=ratio * (1 + spread),
        )

    outcomes = [
        reading("tight-fast", 1.5, 0.01),  # fastest, but its interval is tight: nothing to re-measure
        reading("wide-slow", 0.9, 0.2),
        reading("wide-fast", 1.3, 0.2),
        reading("failed", 2.0, 0.2, verdict="crashed"),
    ]
    policy = PromotionPolicy(confirm_halfwidth=0.05, steering_remeasures=1)
    assert [o.candidate_id for o in readings_to_remeasure(outcomes, policy)] == ["wide-fast"]
    policy = PromotionPolicy(confirm_halfwidth=0.05, steering_remeasures=5)
    assert [o.candidate_id for o in readings_to_remeasure(outcomes, policy)] == ["wide-fast", "wide-slow"]
    assert readings_to_remeasure(outcomes, PromotionPolicy(steering_remeasures=0)) == []


def test_a_playoff_challenger_is_one_not_known_to_be_slower_than_the_incumbent() -> None:
    seed = Candidate(candidate_id="seed", source="", label="seed", proposer="seed")
    incumbent = Incumbent(candidate=seed, artifact_id="A", speedup=0.286, ci_low=0.279, ci_high=0.294, generation=0)

    def timed(speedup_high: float, ratio_high: float, against: str | None, verdict: str = "ok") -> CandidateOutcome:
        return CandidateOutcome(
            candidate_id="c",
            label="c",
            verdict=verdict,
            artifact_id="B",
            ratio=ratio_high - 0.03,
            ratio_ci_low=ratio_high - 0.06,
            ratio_ci_high=ratio_high,
            speedup=speedup_high - 0.01,
            speedup_ci_high=speedup_high,
            timed_against=against,
        )

    assert could_beat(timed(0.283, 0.95, "A"), incumbent)  # its speedup interval reaches the incumbent's
    # numpy ran faster in its run, so its speedup reads low, but head to head it is as fast as the incumbent
    assert could_beat(timed(0.274, 1.029, "A"), incumbent)
    # Histories recorded before the head-to-head rule replay with the speedup interval alone.
    assert not could_beat(timed(0.274, 1.029, "A"), incumbent, head_to_head=False)
    assert could_beat(timed(0.283, 0.95, "A"), incumbent, head_to_head=False)
    # the same ratio against an earlier incumbent says nothing about this one
    assert not could_beat(timed(0.274, 1.029, "older"), incumbent)
    assert not could_beat(timed(0.274, 1.029, None), incumbent)
    assert not could_beat(timed(0.274, 0.99, "A"), incumbent)  # slower head to head, with confidence
    assert not could_beat(timed(0.5, 2.0, "A", verdict="incorrect"), incumbent)


SLOW_COPY_SEED = """#include <stdint.h>

/* Deliberately slow: 64 passes through volatile stores the compiler must keep, so every template setting
   beats this seed by far more than any noise, and the test always has a promotion to re-measure. */
void copy(const float *x, float *y, int64_t n) {
    volatile float *out = y;
    for (int pass = 0; pass < 64; pass++)
        for (int64_t i = 0; i < n; i++) out[i] = x[i];
}
"""


async def test_a_shaky_promotion_is_re_measured_and_promotes_only_if_it_holds(
    client: Client, store: EventStore, prefix: str, tmp_path: Path
) -> None:
    # A copy whose seed is many times slower than any template setting: whether a candidate beats the seed
    # must not depend on the machine's noise (with softmax's own seed, three candidates 1.3x faster
    # sometimes all read within the margin on a loaded machine, and the test proved nothing).
    folder = tmp_path / "slow_seed_copy"
    shutil.copytree(COPY_PROBLEM, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "seed.c").write_text(SLOW_COPY_SEED)
    # confirm_halfwidth 0: every promotion over an incumbent is re-measured first.
    spec = {"problem": str(folder), "generations": 1, "candidates_per_generation": 3, "seed": 11, **QUICK}
    async with running_worker(client, store, prefix):
        handle = await start(client, prefix, {**spec, "promotion": {"confirm_halfwidth": 0.0}})
        result = await handle.result()
    assert result.status == "completed"
    events = await store.read_stream(stream_of(handle.id))
    assert_complete_record(events, result)
    policy = PromotionPolicy()
    [generation] = [e.payload for e in events if e.type == "generation.completed" and e.payload["generation"] == 1]
    chosen = choose_promotion([CandidateOutcome.model_validate(o) for o in generation["outcomes"]], policy)
    assert chosen is not None, "no candidate beat the seed: the test proved nothing"
    seed_promotion = next(e for e in events if e.type == "incumbent.promoted")
    rounds = [
        e
        for e in events
        if e.type == "candidate.remeasured"
        and e.payload["candidate_id"] == chosen.candidate_id
        and e.payload["evidence"]["incumbent_artifact_id"] is not None
    ]
    assert rounds, "the promotion was not re-measured"
    confirmation = rounds[0]
    assert confirmation.position < generation_position(events, 1)
    # The generation's own promotion: the final playoff, which may promote another kernel at the end, records
    # its promotion under the same generation number and its own event id.
    promoted = [
        e.payload
        for e in events
        if e.type == "incumbent.promoted"
        and e.payload["generation"] == 1
        and not e.event_id.endswith("/playoff/promoted")
    ]
    output = confirmation.payload["output"]
    if output["verdict"] == "ok" and output["ratio_ci_low"] > 1 + policy.margin:
        # It held: promoted with the re-measurement's figures, and saying so.
        [promotion] = promoted
        assert promotion["candidate_id"] == chosen.candidate_id and "confirmed" in promotion["reason"]
        assert promotion["ratio_ci_low"] == output["ratio_ci_low"] and promotion["speedup"] == output["speedup"]
    else:
        assert not promoted, "a promotion its re-measurement did not hold up went through"
    assert seed_promotion.payload["generation"] == 0
    # The generation's fastest shaky reading was re-measured before anything used it (steering_remeasures 1),
    # and the outcome the promotion read carries the re-measurement's figures.
    first = {
        e.payload["candidate_id"]: e.payload["output"]
        for e in events
        if e.type == "candidate.benchmarked" and e.payload["generation"] == 1 and e.payload["output"]["verdict"] == "ok"
    }
    fastest = max(first, key=lambda cid: first[cid]["ratio"])
    assert {o["method"] for o in first.values()} == {CPU_MEASUREMENT_METHOD}  # each outcome says how it was read
    # ... and on which machine; the proposer was told the machine the target's worker runs on, the same one, so
    # the evidence it reads settles settings only when it was taken there.
    here = machine_key(backend_for("cpu").fingerprint())
    assert {o["machine"] for o in first.values()} == {here}
    proposals = [
        json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)
        for e in (await handle.fetch_history()).events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "kf.propose"
    ]
    assert proposals and all(p["target_machine"] == here for p in proposals)
    again = [e for e in events if e.type == "candidate.remeasured" and e.payload["candidate_id"] == fastest]
    assert again and again[0].position < generation_position(events, 1)
    [settled] = [o for o in generation["outcomes"] if o["candidate_id"] == fastest]
    if again[0].payload["output"]["verdict"] == "ok":
        assert settled["remeasured"] and settled["ratio"] == again[0].payload["output"]["ratio"]
    else:
        assert not settled["remeasured"] and settled["ratio"] == first[fastest]["ratio"]


def generation_position(events: list[Any], generation: int) -> int:
    """The log position of the generation.completed event of ``generation``."""
    return next(
        e.position for e in events if e.type == "generation.completed" and e.payload["generation"] == generation
    )


async def test_the_web_ui_payload_alone_starts_a_complete_search(client: Client, store: EventStore) -> None:
    # Exactly what a user types into the Temporal UI: every other field takes its default, including the
    # default task queue prefix, so this test's worker serves the default queues.
    async with running_worker(client, store, "kf"):
        handle = await client.start_workflow(
            "KernelSearch",
            {"problem": "softmax"},
            id=f"search-ui-{uuid.uuid4().hex[:8]}",
            task_queue="kf-control",
            result_type=SearchResult,
        )
        await wait_for(client, handle.id, lambda s: s.candidates_done >= 1)
        await handle.execute_update("stop", result_type=SearchStatus)
        result = await handle.result()
    assert result.status == "stopped"
    assert result.candidates_done >= 1
    started = (await store.read_stream(stream_of(handle.id)))[0]
    assert started.payload["spec"]["generations"] == 3
    assert started.payload["spec"]["target"] == "cpu"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"problem": "softmax", "generations": -1}, "generations"),
        ({"problem": "softmax", "budget": {"max_candidates": -5}}, "max_candidates"),
        ({"problem": "no-such-problem"}, "unknown problem 'no-such-problem'"),
        ({"problem": "softmax", "generationz": 2}, "generationz"),
        # More threads than the worker's machine has: every benchmark would fail there, for the whole budget.
        ({"problem": "softmax", "threads": len(os.sched_getaffinity(0)) + 1}, "may use"),
    ],
)
async def test_bad_input_fails_the_search_at_once(
    client: Client, store: EventStore, prefix: str, payload: dict[str, Any], message: str
) -> None:
    async with running_worker(client, store, prefix):
        handle = await start(client, prefix, payload)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), timeout=60)
    assert message in str(failure.value.cause)


@pytest.mark.parametrize(
    ("broken", "said"),
    [
        ('return {"y": inputs["x"] * np.nan}', "a reference must be finite"),
        # In the worker's own process this would end the worker (here: the test run); the problem's host ends.
        ("import os; os._exit(3)", "ended the process that ran it with exit status 3"),
    ],
    ids=["nan", "exit"],
)
async def test_a_broken_problem_definition_stops_the_search_with_its_reason(
    client: Client, store: EventStore, prefix: str, tmp_path: Path, broken: str, said: str
) -> None:
    # A folder that loads, but whose reference is unusable: no candidate can be judged, and none is to blame.
    folder = tmp_path / "broken_reference"
    shutil.copytree(COPY_PROBLEM, folder, ignore=shutil.ignore_patterns("__pycache__"))
    problem_py = folder / "problem.py"
    problem_py.write_text(problem_py.read_text().replace('return {"y": inputs["x"].astype(np.float64)}', broken))
    async with running_worker(client, store, prefix):
        handle = await start(client, prefix, {"problem": str(folder), "generations": 3, **QUICK})
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), timeout=120)
        # Its status query answers from the last state, which said running: `kf search show` must say failed.
        assert (await search_status(client, handle.id)).status == "failed"
    message = str(failure.value.cause)
    assert "the problem's definition failed, not a kernel" in message and said in message
    assert str(problem_py) in message
    # It stopped at the seed, and what it met is recorded as the harness's failure, never as a kernel's verdict.
    events = await store.read_stream(stream_of(handle.id))
    errors = [e for e in events if e.type == "candidate.harness_error"]
    assert len(errors) == 1 and errors[0].payload["error_type"] == "ProblemDefinitionError"
    assert not [e for e in events if e.type in ("candidate.validated", "candidate.benchmarked")]


async def test_a_target_no_worker_serves_fails_naming_the_queue(client: Client, store: EventStore, prefix: str) -> None:
    queue = f"{prefix}-cuda-sm90"
    async with running_worker(client, store, prefix):
        handle = await start(client, prefix, {"problem": "softmax", "target": "cuda-sm90", "worker_wait_seconds": 12})
        # Meanwhile `kf search show` says what the search waits for and how to give it one: a step scheduled on a
        # queue no worker polls (the control queue's worker answers the query).
        deadline = asyncio.get_running_loop().time() + 10
        status = await search_status(client, handle.id)
        while not status.waiting and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)
            status = await search_status(client, handle.id)
        assert status.status == "running" and len(status.waiting) == 1, status
        assert f"on task queue {queue!r}" in status.waiting[0] and "no worker has polled it" in status.waiting[0]
        assert "without one the search fails at" in status.waiting[0] and "start `kf worker`" in status.waiting[0]
        assert "waiting for a worker" in progress_line(status)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), timeout=60)
    assert queue in str(failure.value.cause)


async def wait_for(client: Client, search_id: str, condition: Any, timeout: float = 120) -> SearchStatus:
    """Poll the status query until ``condition(status)`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            status = await client.get_workflow_handle(search_id).query("status", result_type=SearchStatus)
            if condition(status):
                return status
        except Exception:
            pass  # not started yet
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"search {search_id} did not reach the condition in {timeout}s")
        await asyncio.sleep(0.2)


async def test_pause_resume_hint_and_stop(client: Client, store: EventStore, prefix: str) -> None:
    async with running_worker(client, store, prefix):
        handle = await start(
            client, prefix, {"problem": "softmax", "generations": 5, "candidates_per_generation": 1, **QUICK}
        )
        await wait_for(client, handle.id, lambda s: s.candidates_done >= 1)
        paused = await handle.execute_update("pause", result_type=SearchStatus)
        assert paused.status == "paused"
        # Work already started finishes; after that nothing new starts while paused.
        await asyncio.sleep(3)
        frozen = (await wait_for(client, handle.id, lambda s: True)).candidates_done
        await asyncio.sleep(3)
        assert (await wait_for(client, handle.id, lambda s: True)).candidates_done == frozen

        hinted = await handle.execute_update("add_hint", "try the online softmax", result_type=SearchStatus)
        assert "try the online softmax" in hinted.hints
        # Extending raises a limit; a lower one is refused by the search, and `kf` says so as bad input.
        await handle.execute_update("extend_budget", {"max_candidates": 50}, result_type=SearchStatus)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("extend_budget", {"max_candidates": 2}, result_type=SearchStatus)
        said = exit_status.classify(refused.value)
        assert said is not None and said[0] == exit_status.BAD_INPUT and "below the search's" in said[1], said
        await handle.execute_update("resume", result_type=SearchStatus)
        await wait_for(client, handle.id, lambda s: s.candidates_done > frozen)
        # Its steps start as soon as the worker is free: nothing waits for a worker that is not there.
        assert (await search_status(client, handle.id)).waiting == []
        await handle.execute_update("stop", result_type=SearchStatus)
        result = await handle.result()
        await assert_list_agrees_with_show(client, handle.id)
    await keep_history(handle, "pause_hint_stop")

    assert result.status == "stopped"
    events = await store.read_stream(stream_of(handle.id))
    assert_complete_record(events, result)
    types = [e.type for e in events]
    assert {"search.paused", "search.resumed", "search.hint_added", "search.stop_requested"} <= set(types)
    # The hint reached the proposer's input of every generation proposed after it.
    hint_at = types.index("search.hint_added")
    later = [e for e in events[hint_at:] if e.type == "generation.proposed"]
    assert later and all("try the online softmax" in e.payload["hints"] for e in later)


async def test_continue_as_new_keeps_the_search_state(client: Client, store: EventStore, prefix: str) -> None:
    async with running_worker(client, store, prefix):
        handle = await start(
            client,
            prefix,
            {
                "problem": COPY_PROBLEM,
                "generations": 2,
                "candidates_per_generation": 1,
                "continue_as_new_every": 1,
                **QUICK,
            },
        )
        result = await handle.result()
    await keep_history(handle, "continued_as_new_last_run")
    assert result.status == "completed" and result.generations_run == 3
    assert result.candidates_done == 3
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{handle.id}'")]
    assert len(runs) >= 3, "each generation ran in its own run"
    events = await store.read_stream(stream_of(handle.id))
    assert_complete_record(events, result)
    assert len({e.metadata.get("run_id") for e in events if e.type == "candidate.compiled"}) == 3


async def test_resume_from_starts_at_the_earlier_incumbent_and_skips_its_candidates(
    client: Client, store: EventStore, prefix: str
) -> None:
    async with running_worker(client, store, prefix):
        spec = {"problem": COPY_PROBLEM, "generations": 1, "candidates_per_generation": 3, **QUICK}
        first = await start(client, prefix, spec)
        first_result = await first.result()
        second = await start(client, prefix, {**spec, "resume_from": first.id})
        await second.result()
        # Another problem's incumbent is no seed: resuming from it is refused at once.
        other = await start(client, prefix, {"problem": "softmax", "resume_from": first.id, **QUICK})
        with pytest.raises(WorkflowFailureError) as refused:
            await asyncio.wait_for(other.result(), timeout=60)
        assert "is a search of 'copy', not 'softmax'" in str(refused.value.cause), refused.value.cause
        # Once Temporal forgets the first search (its retention), its id is still the event log's: a new search
        # under it is refused, and nothing of it -- not even a message sent before the refusal -- joins the record.
        recorded = len(await store.read_stream(stream_of(first.id)))
        await forget(client, first.id)
        again = await start(client, prefix, spec, search_id=first.id)
        with contextlib.suppress(WorkflowUpdateFailedError, RPCError):
            await again.execute_update("add_hint", "joins no record", result_type=SearchStatus)
        with pytest.raises(WorkflowFailureError) as taken:
            await asyncio.wait_for(again.result(), timeout=60)
        assert f"search id {first.id!r} is taken" in str(taken.value.cause), taken.value.cause
        assert len(await store.read_stream(stream_of(first.id))) == recorded
    assert first_result.incumbent is not None
    earlier = await load_search_history(store, first.id)
    later = await load_search_history(store, second.id)
    seed = later.candidates[next(iter(later.candidates))]
    assert seed.candidate_id == first_result.incumbent.candidate_id
    repeated = (set(later.candidates) - {seed.candidate_id}) & set(earlier.candidates)
    assert not repeated, "a candidate of the earlier search was evaluated again"


async def test_the_final_playoff_ends_the_search_on_the_fastest_kernel_it_saw(
    client: Client, store: EventStore, fresh_db_url: str, prefix: str
) -> None:
    # The copy problem's settings are all about as fast: their intervals overlap, so a playoff must decide.
    async with running_worker(client, store, prefix):
        handle = await start(
            client,
            prefix,
            {"problem": COPY_PROBLEM, "generations": 1, "candidates_per_generation": 4, "seed": 5, **QUICK},
        )
        result = await handle.result()
    events = await store.read_stream(stream_of(handle.id))
    assert_complete_record(events, result)
    [playoff] = [e.payload for e in events if e.type == "search.playoff"]
    rounds = playoff["rounds"]
    assert rounds and rounds == result.playoff_rounds
    # Each round's leader is the incumbent, or the challenger that won the round before.
    leader = playoff["incumbent_id"]
    for round_ in rounds:
        assert round_["leader_id"] == leader and round_["challenger_id"] != leader
        if round_["challenger_won"]:
            assert round_["ratio_ci_low"] > 1.0
            leader = round_["challenger_id"]
    assert playoff["winner_id"] == leader == result.incumbent.candidate_id
    # A re-measurement, never a new verdict: the playoff adds no candidate step outcomes.
    rounds_recorded = [e for e in events if e.type == "search.playoff_round"]
    assert len(rounds_recorded) == len([r for r in rounds if r["verdict"] != "harness_error"])
    promoted = [
        e.payload for e in events if e.type == "incumbent.promoted" and e.event_id.endswith("/playoff/promoted")
    ]
    assert bool(promoted) == (leader != playoff["incumbent_id"])
    history = await load_search_history(store, handle.id)
    assert history.incumbent is not None and history.incumbent.candidate.candidate_id == leader
    # The audit lists each round under its challenger, after the challenger's own steps, and the playoff's result.
    report = await audit_search(fresh_db_url, handle.id)
    by_id = {c["candidate_id"]: c for c in report["candidates"]}
    for event in rounds_recorded:
        steps = by_id[event.payload["candidate_id"]]["steps"]
        assert [s["step"] for s in steps][:3] == ["compiled", "validated", "benchmarked"]
        assert steps[-1]["step"] == "playoff" and steps[-1]["event_id"] == event.event_id
        assert steps[-1]["busy"] == event.payload["output"]["shared_cores"]
        # Timed against the playoff's leader, which is the incumbent only until a challenger takes the lead.
        assert " vs leader [" in steps[-1]["summary"] and "incumbent" not in steps[-1]["summary"], steps[-1]
    assert report["playoff"]["winner_id"] == leader and len(report["playoff"]["rounds"]) == len(rounds)
    # The result counts every timing the search took, and those a busy machine took, as recorded.
    timings = [e for e in events if e.type in ("candidate.benchmarked", "candidate.remeasured", "search.playoff_round")]
    assert result.timings == len(timings) > len(rounds_recorded), result
    assert result.busy_timings == sum(bool(e.payload["output"]["shared_cores"]) for e in timings), result
    assert f"final playoff: {len(rounds)} round(s)" in format_audit(report)
