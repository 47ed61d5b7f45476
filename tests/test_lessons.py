"""The lessons projection and lessons_for, on synthetic search histories in a real Postgres."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from lessons_fixtures import TARGET, SyntheticSearch, record_random_search, softmax_failure

from engine.evidence import lessons as lessons_module
from engine.evidence.events import NewEvent
from engine.evidence.index import recorded_evidence
from engine.evidence.lessons import FAMILY_MAX_WEIGHT, SUMMARY_LINES, lessons_for
from engine.evidence.lessons_projection import (
    BUSY_READING_HALFWIDTH,
    PROJECTION,
    _Fold,
    apply_events,
    catch_up_lessons,
    rebuild_lessons,
)
from engine.evidence.migrations import MIGRATIONS_DIR
from engine.evidence.projections import checkpoint_of
from engine.evidence.store import EventStore
from engine.harness.verdicts import CPU_MEASUREMENT_METHOD, LEGACY_METHOD
from engine.problems import load_problem
from engine.search.candidates import Candidate
from engine.search.steps import StepOutput

VIEW_TABLES = {
    "lesson_searches": "stream_id",
    "lesson_candidates": "stream_id, candidate_id",
    "lesson_stats": "family, problem, target, change",
    "lesson_failures": "family, problem, target, change, kind, pattern",
    "candidate_evidence": "candidate_id, target, problem_fingerprint",
    "lesson_settings": "family, problem, target, candidate_id",
}


async def view_rows(store: EventStore) -> dict[str, list[dict[str, Any]]]:
    return {
        table: [dict(r) for r in await store.pool.fetch(f"SELECT * FROM {table} ORDER BY {order}")]
        for table, order in VIEW_TABLES.items()
    }


async def test_incremental_catch_up_equals_rebuild_from_zero(store: EventStore) -> None:
    drawn = Counter[str]()

    def every_third_fails(params: dict[str, Any]) -> str | None:
        # A failure however the template space's random draws fall (a draw of softmax's space can miss every
        # setting softmax_failure fails), so the failure view is never compared empty against empty.
        drawn["candidates"] += 1
        return "compile_error" if drawn["candidates"] % 3 == 1 else softmax_failure(params)

    # Three searches, caught up after each and in small pages, so page boundaries fall everywhere.
    await record_random_search(store, "s1", "softmax", seed=1, generations=3, failure=every_third_fails)
    await catch_up_lessons(store, page_size=7)
    await record_random_search(store, "s2", "softmax", seed=2, generations=2, record_family=False)
    await catch_up_lessons(store, page_size=3)
    await record_random_search(store, "s3", "rmsnorm", seed=3, generations=2, failure=lambda p: None)
    reached = await catch_up_lessons(store, page_size=11)
    assert reached == await store.last_position()
    incremental = await view_rows(store)
    assert incremental["lesson_stats"] and incremental["lesson_failures"] and incremental["candidate_evidence"]
    assert {r["problem"] for r in incremental["lesson_settings"]} == {"softmax", "rmsnorm"}

    assert await rebuild_lessons(store) == reached
    assert await view_rows(store) == incremental
    # Once more from zero in one-event pages: still the same rows.
    await rebuild_lessons(store, page_size=1)
    assert await view_rows(store) == incremental


async def test_a_catch_up_reads_only_the_candidates_its_events_name(store: EventStore) -> None:
    """A long search catches up at every compile and validation: reading all its candidates each time made
    that cost grow with the search (issue 12 item 8). A page reads the rows of the candidates it names."""
    tried = await record_random_search(store, "s1", "softmax", seed=1, generations=4, per_generation=4)
    await catch_up_lessons(store)
    stored = await store.pool.fetchval("SELECT count(*) FROM lesson_candidates WHERE stream_id = 'search-s1'")
    assert stored == len(tried) > 10
    newest = [e for e in await store.read_stream("search-s1") if e.type == "candidate.benchmarked"][-1]
    async with store.pool.acquire() as connection:
        fold = _Fold(connection)
        await fold.prefetch_candidates([newest])
        assert set(fold.candidates) == {("search-s1", newest.payload["candidate_id"])}
        assert fold.candidates[("search-s1", newest.payload["candidate_id"])] is not None
        # A candidate nobody stored is looked up once and remembered as unknown.
        assert await fold.stream_candidate("search-s1", "f" * 64) is None
        assert ("search-s1", "f" * 64) in fold.candidates


async def test_a_crash_between_view_and_checkpoint_changes_neither(store: EventStore) -> None:
    await record_random_search(store, "s1", "softmax", seed=1, generations=1)
    before_position = await catch_up_lessons(store)
    await record_random_search(store, "s2", "softmax", seed=2, generations=2)
    before_rows = await view_rows(store)

    with pytest.raises(RuntimeError, match="crash"):
        async with store.projection(PROJECTION) as tx:
            await apply_events(tx, await tx.read(limit=1000))
            assert tx.checkpoint > before_position
            raise RuntimeError("crash after the view was written, before the commit")

    assert await checkpoint_of(store.pool, PROJECTION) == before_position
    assert await view_rows(store) == before_rows
    # The next catch-up applies the events exactly once.
    await catch_up_lessons(store)
    caught_up = await view_rows(store)
    await rebuild_lessons(store)
    assert await view_rows(store) == caught_up


async def test_lessons_count_what_happened(store: EventStore) -> None:
    tried = await record_random_search(store, "s1", "softmax", seed=4, generations=5, per_generation=3)
    lessons = await lessons_for(store, "softmax", TARGET)
    assert lessons.family == "row-reduction" and lessons.target == TARGET
    assert lessons.candidates == len(tried)
    assert lessons.through_position == await store.last_position()
    params = [c.params for c in tried if c.params]
    unroll2 = [p for p in params if p["UNROLL"] == 2]
    if unroll2:
        stats = next(c for c in lessons.changes if c.change == "UNROLL=2")
        assert stats.attempts == len(unroll2)
        assert stats.compiled == sum(p["SIMD"] == 1 for p in unroll2)
        assert stats.correct == sum(p["SIMD"] == 1 and p["ONLINE"] == 1 for p in unroll2)
    # The seed (0.5x numpy) is slower than every template: its advantage is below 1, SIMD=1's above.
    assert lessons.priors["seed"].log_advantage_mean < 0
    if any(p["SIMD"] == 1 for p in params) and any(p["SIMD"] == 0 for p in params):
        simd = lessons.priors["SIMD=1"]
        assert simd.log_advantage_mean > lessons.priors["SIMD=0"].log_advantage_mean
        assert simd.correct_alpha > 1
    assert len(lessons.summary.splitlines()) <= SUMMARY_LINES
    assert "softmax" in lessons.summary
    measured = [s for s in lessons.settings if s.problem == "softmax"]
    assert measured
    best = max(measured, key=lambda s: s.log_speedup_mean)
    line = next(x for x in lessons.summary.splitlines() if x.startswith("Fastest measured settings"))
    assert f"{math.exp(best.log_speedup_mean):.2f}x (n={best.n})" in line.split(";")[0]


async def test_rmsnorm_learns_from_softmax_through_the_family(store: EventStore) -> None:
    await record_random_search(store, "s1", "softmax", seed=5, generations=4, per_generation=4)
    lessons = await lessons_for(store, "rmsnorm", TARGET)
    assert lessons.candidates == 0 and lessons.family_candidates > 0
    streaming = lessons.priors["NT=1"]  # a knob both templates have, drawn often in softmax's space
    # Family evidence counts half as much as the problem's own, and a few candidates' worth at most.
    own = (await lessons_for(store, "softmax", TARGET)).priors["NT=1"]
    assert streaming.evidence == pytest.approx(min(own.evidence / 2, FAMILY_MAX_WEIGHT))
    assert streaming.log_advantage_mean == pytest.approx(own.log_advantage_mean)
    assert next(c for c in lessons.changes if c.change == "NT=1").scope == "family"
    assert "other problems of the family" in lessons.summary


async def test_summary_stays_bounded_for_a_large_history(store: EventStore) -> None:
    loaded = load_problem("softmax")
    search = SyntheticSearch(store, "big", "softmax")
    seed = Candidate.create(loaded.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    events: list[NewEvent] = [*search.start(seed)]
    events += search.outcome(0, seed, failure=None, speedup=0.5, parent_speedup=None)
    # 600 candidates of an imagined LLM, each with its own tags: many changes, many failure patterns.
    for i in range(600):
        tags = [f"idea-{i % 97}", f"trick-{i % 41}", f"variant-{i}"]
        candidate = Candidate.create(f"/* {i} */", None, label=f"llm #{i}", proposer="llm", tags=tags)
        candidate = candidate.model_copy(update={"parent_id": seed.candidate_id})
        failure = "compile_error" if i % 5 == 0 else "incorrect" if i % 7 == 0 else None
        speed = 0.4 + (i % 13) / 10
        events.append(search.proposed(1 + i // 50, candidate))
        events += search.outcome(1 + i // 50, candidate, failure=failure, speedup=speed, parent_speedup=0.5)
    for start in range(0, len(events), 400):
        await store.append(search.stream, events[start : start + 400])
    lessons = await lessons_for(store, "softmax", TARGET)
    lines = lessons.summary.splitlines()
    assert 3 <= len(lines) <= SUMMARY_LINES
    assert all(len(line) <= 160 for line in lines)
    assert lessons.candidates == 601
    assert len(lessons.priors) <= 64 and len(lessons.failures) <= 10
    assert any("compile failure 'undeclared'" in line for line in lines)


async def test_dead_ends_are_named(store: EventStore) -> None:
    await record_random_search(
        store,
        "s1",
        "softmax",
        seed=6,
        generations=5,
        per_generation=3,
        failure=lambda p: "compile_error" if p["UNROLL"] == 8 else None,
    )
    lessons = await lessons_for(store, "softmax", TARGET)
    unroll8 = next(c for c in lessons.changes if c.change == "UNROLL=8")
    if unroll8.attempts >= 3:
        assert "UNROLL=8" in lessons.dead_ends and lessons.priors["UNROLL=8"].dead_end
        assert "never compiled" in (unroll8.dead_end or "") and "Dead ends: UNROLL=8" in lessons.summary


async def test_evidence_index_finds_an_earlier_search_outcome_and_reuse_is_not_counted_twice(
    store: EventStore,
) -> None:
    tried = await record_random_search(store, "s1", "softmax", seed=7, generations=2, per_generation=2)
    before = await lessons_for(store, "softmax", TARGET)
    # A second search on the same target and problem definition.
    loaded = load_problem("softmax")
    second = SyntheticSearch(store, "s2", "softmax")
    seed = tried[0]
    await store.append(second.stream, second.start(seed))
    found = await recorded_evidence(store, "s2", seed.candidate_id)
    assert found is not None and found.compile_verdict == "ok" and found.validation_verdict == "ok"
    assert found.compile_event_id is not None and found.compile_event_id.startswith("s1/")
    assert found.reference("compile")["reused_from"]["event_id"] == found.compile_event_id
    # The second search reuses the seed's outcomes: the same facts, so attempts do not grow.
    await store.append(
        second.stream, second.outcome(0, seed, failure=None, speedup=0.52, parent_speedup=None, reused=True)
    )
    after = await lessons_for(store, "softmax", TARGET)
    assert after.candidates == before.candidates
    seed_before, seed_after = before.priors["seed"], after.priors["seed"]
    assert seed_after.correct_alpha == seed_before.correct_alpha
    assert seed_after.log_advantage_n == seed_before.log_advantage_n + 1  # a benchmark is new evidence
    # Another problem definition (fingerprint) or target finds nothing.
    other = SyntheticSearch(store, "s3", "softmax", fingerprint="fingerprint-2")
    await store.append(other.stream, other.start(seed))
    assert await recorded_evidence(store, "s3", seed.candidate_id) is None
    assert await recorded_evidence(store, "s2", "0" * 64) is None
    del loaded


async def test_ratio_is_attributed_to_the_changes_a_candidate_introduced(store: EventStore) -> None:
    loaded = load_problem("softmax")
    search = SyntheticSearch(store, "s1", "softmax")
    seed = Candidate.create(loaded.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    events = [*search.start(seed), *search.outcome(0, seed, failure=None, speedup=0.5, parent_speedup=None)]
    from engine.proposers.random_template import template_candidate, template_space

    # Any other parameters of the template keep one value throughout: only UNROLL changes in the second.
    base = template_space(loaded)[0]
    first = template_candidate(
        loaded, {**base, "ONLINE": 0, "UNROLL": 4, "SIMD": 0}, None, proposer="t", parent_id=seed.candidate_id
    )
    second = template_candidate(
        loaded, {**base, "ONLINE": 0, "UNROLL": 8, "SIMD": 0}, None, proposer="t", parent_id=first.candidate_id
    )
    events += [search.proposed(1, first), *search.outcome(1, first, failure=None, speedup=1.0, parent_speedup=0.5)]
    events += [search.proposed(2, second), *search.outcome(2, second, failure=None, speedup=1.5, parent_speedup=1.0)]
    await store.append(search.stream, events)
    lessons = await lessons_for(store, "softmax", TARGET)
    by_change = {c.change: c for c in lessons.changes}
    # The first changed everything relative to the seed; the second only UNROLL.
    assert by_change["UNROLL=4"].versus_parent == 1 and by_change["ONLINE=0"].versus_parent == 1
    assert by_change["UNROLL=8"].versus_parent == 1
    assert by_change["UNROLL=8"].speedup_over_parent == pytest.approx(1.5)
    assert by_change["UNROLL=4"].speedup_over_parent == pytest.approx(2.0)
    assert by_change["UNROLL=8"].beats_parent == 1
    assert math.isclose(lessons.priors["UNROLL=8"].log_ratio_mean, math.log(1.5))


async def test_kf_lessons_prints_summaries_and_json(
    store: EventStore, fresh_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import asyncio
    import json

    from cli import lessons as cli

    parser = argparse.ArgumentParser(prog="kf")
    cli.register(parser.add_subparsers())
    await record_random_search(store, "s1", "softmax", seed=8, generations=2)
    await record_random_search(store, "s2", "rmsnorm", seed=8, generations=2, failure=lambda p: None)

    def kf(*argv: str) -> int:
        args = parser.parse_args(["lessons", "--database-url", fresh_db_url, *argv])
        return int(args.handler(args))

    assert await asyncio.to_thread(kf) == 0
    text = capsys.readouterr().out
    assert "Lessons for rmsnorm" in text and "Lessons for softmax" in text
    assert await asyncio.to_thread(kf, "--problem", "softmax", "--target", TARGET, "--json") == 0
    [only] = json.loads(capsys.readouterr().out)["lessons"]
    assert only["problem"] == "softmax" and only["target"] == TARGET and only["priors"]
    assert await asyncio.to_thread(kf, "--problem", "matmul", "--target", TARGET) == 0
    assert "No lessons yet for matmul" in capsys.readouterr().out


# -- per-setting evidence (lesson_settings) --------------------------------------------------------------


async def test_a_setting_gathers_every_benchmark_of_its_candidate(store: EventStore) -> None:
    loaded = load_problem("softmax")
    from engine.proposers.random_template import template_candidate, template_space

    seed = Candidate.create(loaded.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    params = template_space(loaded)[-1]
    setting = template_candidate(loaded, params, None, proposer="t", parent_id=seed.candidate_id)
    # The same candidate benchmarked in two searches: two measurements of one setting.
    for search_id, speedup in [("s1", 1.2), ("s2", 1.5)]:
        search = SyntheticSearch(store, search_id, "softmax")
        events = [*search.start(seed), *search.outcome(0, seed, failure=None, speedup=0.5, parent_speedup=None)]
        events += [search.proposed(1, setting)]
        events += search.outcome(1, setting, failure=None, speedup=speedup, parent_speedup=0.5)
        await store.append(search.stream, events)

    lessons = await lessons_for(store, "softmax", TARGET)
    # The seed has no parameters: it is no template setting.
    [found] = lessons.settings
    assert found.problem == "softmax" and found.candidate_id == setting.candidate_id and found.params == params
    samples = [math.log(1.2), math.log(1.5)]
    assert found.n == 2
    assert found.log_speedup_mean == pytest.approx(sum(samples) / 2)
    assert found.log_speedup_var == pytest.approx((samples[0] - samples[1]) ** 2 / 2)


async def test_a_setting_keeps_how_wide_its_readings_were_and_a_busy_one_counts_as_wide(store: EventStore) -> None:
    loaded = load_problem("softmax")
    from engine.proposers.random_template import template_candidate, template_space

    seed = Candidate.create(loaded.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    quiet, busy = (
        template_candidate(loaded, params, None, proposer="t", parent_id=seed.candidate_id)
        for params in template_space(loaded)[-2:]
    )
    # Two quiet readings, ±2% and ±10%, in two searches; one busy reading whose own interval looks tight (±1%).
    for search_id, spread in [("s1", 0.02), ("s2", 0.10)]:
        search = SyntheticSearch(store, search_id, "softmax")
        events = [*search.start(seed), *search.outcome(0, seed, failure=None, speedup=0.5, parent_speedup=None)]
        events += [search.proposed(1, quiet)]
        events += search.outcome(1, quiet, failure=None, speedup=1.2, parent_speedup=0.5, spread=spread)
        if search_id == "s1":
            events += [search.proposed(1, busy)]
            events += search.outcome(
                1, busy, failure=None, speedup=4.0, parent_speedup=0.5, spread=0.01, shared_cores=True
            )
        await store.append(search.stream, events)

    by_id = {s.candidate_id: s for s in (await lessons_for(store, "softmax", TARGET)).settings}
    widths = [(math.log(1.02) - math.log(0.98)) / 2, (math.log(1.10) - math.log(0.90)) / 2]
    assert by_id[quiet.candidate_id].log_interval_halfwidth == pytest.approx(sum(widths) / 2)
    assert by_id[busy.candidate_id].log_interval_halfwidth == pytest.approx(BUSY_READING_HALFWIDTH)


async def test_a_re_measurement_is_another_reading_of_the_setting_and_never_a_verdict(store: EventStore) -> None:
    loaded = load_problem("softmax")
    from engine.proposers.random_template import template_candidate, template_space

    seed = Candidate.create(loaded.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    spiked, crashed = (
        template_candidate(loaded, params, None, proposer="t", parent_id=seed.candidate_id)
        for params in template_space(loaded)[-2:]
    )
    search = SyntheticSearch(store, "s1", "softmax")
    events = [*search.start(seed), *search.outcome(0, seed, failure=None, speedup=0.5, parent_speedup=None)]
    for candidate in (spiked, crashed):
        events += [search.proposed(1, candidate)]
        events += search.outcome(1, candidate, failure=None, speedup=4.0, parent_speedup=0.5, shared_cores=True)

    def remeasured(candidate: Candidate, output: StepOutput) -> NewEvent:
        return search.event(
            f"s1/g1/{candidate.candidate_id[:24]}/remeasured",
            "candidate.remeasured",
            {"generation": 1, "candidate_id": candidate.candidate_id, "output": output.model_dump(mode="json")},
        )

    # The load spike's 4.0 re-measures at 2.0 (±1%); the other re-measurement did not come back ok.
    events += [
        remeasured(
            spiked,
            StepOutput(
                step="confirm", verdict="ok", event_id="", speedup=2.0, speedup_ci_low=1.98, speedup_ci_high=2.02
            ),
        ),
        remeasured(crashed, StepOutput(step="confirm", verdict="crashed", event_id="")),
    ]
    await store.append(search.stream, events)

    lessons = await lessons_for(store, "softmax", TARGET)
    by_id = {s.candidate_id: s for s in lessons.settings}
    assert by_id[spiked.candidate_id].n == 2
    assert by_id[spiked.candidate_id].log_speedup_mean == pytest.approx((math.log(4.0) + math.log(2.0)) / 2)
    busy_and_tight = (BUSY_READING_HALFWIDTH + (math.log(2.02) - math.log(1.98)) / 2) / 2
    assert by_id[spiked.candidate_id].log_interval_halfwidth == pytest.approx(busy_and_tight)
    # A re-measurement is never a verdict: the crashed one added no reading and no failure.
    assert by_id[crashed.candidate_id].n == 1
    assert not [f for f in lessons.failures if "crashed" in f.model_dump_json()]


def _measured_setting(store: EventStore) -> tuple[SyntheticSearch, Candidate, list[NewEvent]]:
    """A softmax search that benchmarked its seed and one template setting once, by an outcome recorded before
    outcomes named their measurement method or machine: the search, the setting, and its events to append."""
    loaded = load_problem("softmax")
    from engine.proposers.random_template import template_candidate, template_space

    seed = Candidate.create(loaded.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    setting = template_candidate(loaded, template_space(loaded)[-1], None, proposer="t", parent_id=seed.candidate_id)
    search = SyntheticSearch(store, "s1", "softmax")
    events = [*search.start(seed), *search.outcome(0, seed, failure=None, speedup=0.5, parent_speedup=None)]
    events += [search.proposed(1, setting)]
    events += search.outcome(1, setting, failure=None, speedup=4.0, parent_speedup=0.5)
    return search, setting, events


def _reading(search: SyntheticSearch, setting: Candidate, n: int, speedup: float, **output: Any) -> NewEvent:
    """The ``n``-th re-measurement of ``setting`` at ``speedup`` (±1%), with the output's other fields given."""
    timed = StepOutput(
        step="confirm",
        verdict="ok",
        event_id="",
        speedup=speedup,
        speedup_ci_low=speedup * 0.99,
        speedup_ci_high=speedup * 1.01,
        **output,
    )
    return search.event(
        f"s1/g1/{setting.candidate_id[:24]}/remeasured-{n}",
        "candidate.remeasured",
        {"generation": 1, "candidate_id": setting.candidate_id, "output": timed.model_dump(mode="json")},
    )


async def test_a_newer_measurement_method_replaces_a_settings_readings_and_an_older_one_is_not_mixed_in(
    store: EventStore,
) -> None:
    search, setting, events = _measured_setting(store)
    # Two readings recorded before outcomes named their method: LEGACY_METHOD.
    events.append(_reading(search, setting, 1, 3.8, method=None))
    await store.append(search.stream, events)
    [found] = (await lessons_for(store, "softmax", TARGET)).settings
    assert found.method == LEGACY_METHOD and found.n == 2

    # Today's judge reads it at 3.0: the old readings no longer count, and a later legacy reading (a worker
    # still on the old code) is not mixed in with the new ones.
    await store.append(
        search.stream,
        [
            _reading(search, setting, 2, 3.0, method=CPU_MEASUREMENT_METHOD),
            _reading(search, setting, 3, 4.2, method=LEGACY_METHOD),
        ],
    )
    [found] = (await lessons_for(store, "softmax", TARGET)).settings
    assert found.method == CPU_MEASUREMENT_METHOD and found.n == 1
    assert found.log_speedup_mean == pytest.approx(math.log(3.0))
    # The changes' rows keep every reading, whatever its method.
    before = await view_rows(store)
    [everything] = [r for r in before["lesson_stats"] if r["problem"] == "softmax" and r["change"] == "*"]
    assert len(everything["log_speedup_samples"]) == 5  # the seed's and the setting's four
    # A rebuild from position 0 folds the same.
    await rebuild_lessons(store)
    assert await view_rows(store) == before


async def test_a_setting_keeps_the_readings_of_the_machine_that_last_measured_it(store: EventStore) -> None:
    search, setting, events = _measured_setting(store)

    def reading(n: int, speedup: float, machine: str | None) -> NewEvent:
        return _reading(search, setting, n, speedup, method=CPU_MEASUREMENT_METHOD, machine=machine)

    await store.append(search.stream, events)
    [found] = (await lessons_for(store, "softmax", TARGET)).settings
    assert found.machine is None and found.n == 1
    # Two readings on machine A; then one from a worker that does not say (older code) is not mixed in.
    await store.append(search.stream, [reading(1, 3.0, "machine-a"), reading(2, 3.2, "machine-a")])
    await store.append(search.stream, [reading(3, 9.0, None)])
    [found] = (await lessons_for(store, "softmax", TARGET)).settings
    assert found.machine == "machine-a" and found.n == 2
    assert found.log_speedup_mean == pytest.approx((math.log(3.0) + math.log(3.2)) / 2)
    # Machine B measures it: the row is B's now, and settles the setting only for a search on B.
    await store.append(search.stream, [reading(4, 2.0, "machine-b")])
    [found] = (await lessons_for(store, "softmax", TARGET)).settings
    assert found.machine == "machine-b" and found.n == 1 and found.log_speedup_mean == pytest.approx(math.log(2.0))
    # The changes' rows keep every reading, whatever its machine; a rebuild from position 0 folds the same.
    before = await view_rows(store)
    [everything] = [r for r in before["lesson_stats"] if r["problem"] == "softmax" and r["change"] == "*"]
    assert len(everything["log_speedup_samples"]) == 6  # the seed's and the setting's five
    await rebuild_lessons(store)
    assert await view_rows(store) == before


async def test_settings_of_another_problem_of_the_family_carry_its_name(store: EventStore) -> None:
    softmax = await record_random_search(store, "s1", "softmax", seed=9, generations=2, failure=lambda p: None)
    rmsnorm = await record_random_search(store, "s2", "rmsnorm", seed=9, generations=2, failure=lambda p: None)
    lessons = await lessons_for(store, "softmax", TARGET)
    by_problem = {(s.problem, s.candidate_id): s for s in lessons.settings}
    assert set(by_problem) == {("softmax", c.candidate_id) for c in softmax if c.params} | {
        ("rmsnorm", c.candidate_id) for c in rmsnorm if c.params
    }
    assert all(s.n == 1 and s.log_speedup_var == 0.0 for s in lessons.settings)
    for candidate in rmsnorm[1:]:
        assert by_problem[("rmsnorm", candidate.candidate_id)].params == candidate.params
    assert lessons.settings == sorted(lessons.settings, key=lambda s: (s.problem, s.candidate_id))
    # Another family (matmul) sees none of them.
    assert (await lessons_for(store, "matmul", TARGET)).settings == []


async def test_migration_0004_refolds_the_older_events_into_lesson_settings(
    store: EventStore, fresh_db_url: str
) -> None:
    await record_random_search(store, "s1", "softmax", seed=10, generations=2)
    await record_random_search(store, "s2", "rmsnorm", seed=10, generations=2, failure=lambda p: None)
    reached = await catch_up_lessons(store, page_size=9)
    expected = await view_rows(store)
    assert expected["lesson_settings"]
    # A database as it was before 0004: the view caught up, but no lesson_settings table. Applying the
    # real migration again must make the next catch-up refold the whole log.
    await store.pool.execute("DROP TABLE lesson_settings")
    # Its SQL as the runner applies it (the runner itself refuses 0004 again once later migrations are applied).
    await store.pool.execute((MIGRATIONS_DIR / "0004_lesson_settings.sql").read_text())
    await store.pool.execute((MIGRATIONS_DIR / "0008_setting_reading_widths.sql").read_text())
    await store.pool.execute((MIGRATIONS_DIR / "0010_setting_measurement_method.sql").read_text())
    await store.pool.execute((MIGRATIONS_DIR / "0011_setting_machine.sql").read_text())
    await store.pool.execute((MIGRATIONS_DIR / "0009_fold_remeasurements.sql").read_text())
    assert await checkpoint_of(store.pool, PROJECTION) == 0
    assert all(not rows for rows in (await view_rows(store)).values())

    assert await catch_up_lessons(store, page_size=7) == reached
    assert await view_rows(store) == expected


async def test_lessons_are_keyed_by_the_problem_name_never_its_folder(
    store: EventStore, fresh_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import asyncio
    import json
    import shutil

    from cli import lessons as cli

    folder = tmp_path / "checkout" / "my_softmax"
    shutil.copytree(load_problem("softmax").folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    await record_random_search(store, "s-name", "softmax", seed=4, generations=2)
    named_only = await lessons_for(store, "softmax", TARGET)
    # A search started with the folder's path, recorded as before search.started carried problem_name.
    await record_random_search(store, "s-path", str(folder), seed=3, generations=2)
    by_name = await lessons_for(store, "softmax", TARGET)
    assert by_name.candidates > named_only.candidates
    assert await lessons_for(store, str(folder), TARGET) == by_name
    rows = await store.pool.fetch("SELECT DISTINCT problem FROM lesson_stats")
    assert [r["problem"] for r in rows] == ["softmax"]

    # `kf lessons --problem rmsnorm` without --target: rmsnorm was never searched, its family was.
    parser = argparse.ArgumentParser(prog="kf")
    cli.register(parser.add_subparsers())

    def kf(*argv: str) -> int:
        args = parser.parse_args(["lessons", "--database-url", fresh_db_url, *argv])
        return int(args.handler(args))

    assert await asyncio.to_thread(kf, "--problem", "rmsnorm", "--json") == 0
    [family] = json.loads(capsys.readouterr().out)["lessons"]
    assert family["problem"] == "rmsnorm" and family["target"] == TARGET
    assert family["candidates"] == 0 and family["family_candidates"] == by_name.candidates
    assert await asyncio.to_thread(kf, "--problem", str(folder), "--json") == 0
    [own] = json.loads(capsys.readouterr().out)["lessons"]
    assert own["problem"] == "softmax" and own["candidates"] == by_name.candidates


async def test_only_the_most_recently_measured_settings_of_each_problem_are_read(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await record_random_search(store, "s1", "softmax", seed=1, generations=3)
    await record_random_search(store, "s2", "rmsnorm", seed=2, generations=3)
    await record_random_search(store, "s3", "softmax", seed=3, generations=2)
    await catch_up_lessons(store)
    rows = [r for r in await store.pool.fetch("SELECT * FROM lesson_settings") if r["log_speedup_samples"]]
    counts = Counter(r["problem"] for r in rows)
    cap = min(counts.values()) - 1
    assert set(counts) == {"softmax", "rmsnorm"} and cap >= 2, counts
    monkeypatch.setattr(lessons_module, "MAX_SETTINGS", cap)

    lessons = await lessons_for(store, "softmax", TARGET)

    for problem in counts:
        newest = sorted(
            (r for r in rows if r["problem"] == problem), key=lambda r: (-r["last_position"], r["candidate_id"])
        )[:cap]
        read = [s.candidate_id for s in lessons.settings if s.problem == problem]
        assert read == sorted(r["candidate_id"] for r in newest), problem
