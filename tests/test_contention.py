"""A reading taken while work from outside the benchmark ran on its cores says so (engine/harness/contention.py),
and what reads it treats it as a busy machine's: kf evaluate's evidence, a recorded landscape's samples, a
search's result and progress."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from search_fixtures import COPY_PROBLEM, QUICK, running_worker, start
from temporalio.client import Client

from cli.search import final_status, format_result, progress_line
from engine.evidence.store import EventStore
from engine.harness.contention import FOREIGN_SHARE_BUSY, TICK_S, CoreWatch, busy
from engine.harness.evaluation import evaluate
from engine.harness.machine import machine_limits
from engine.harness.noise import machine_noise_floor
from engine.harness.verdicts import Verdict
from engine.problems import load_problem
from engine.replay import recording
from engine.replay.landscape import (
    LandscapeMeasured,
    LandscapeRecorded,
    LandscapeSample,
    landscape_from_events,
    stored_recordings,
)
from engine.replay.recording import RecordingPlan, record_landscape
from engine.search.history import stream_of
from engine.search.state import SearchStatus


def _watch(cpus: list[int], busy_s: list[list[float]], own_ns: list[int | None], wall: list[float]) -> CoreWatch:
    """A watch whose per-CPU counters, workers' CPU time and clock read the given values in turn."""
    counters, owns, clock = iter(busy_s), iter(own_ns), iter(wall)
    return CoreWatch(cpus, lambda: next(owns), counters=lambda _: next(counters), clock=lambda: next(clock))


def test_the_foreign_share_is_what_the_cores_ran_beyond_the_benchmark() -> None:
    # One leased CPU, one window of 1 s: the CPU ran 0.9 s, the benchmark's workers 0.4 s of it.
    watch = _watch([1], [[10.0], [10.9]], [0, 400_000_000], [100.0, 101.0])
    watch.start()
    watch.stop()
    share = watch.share()
    # Less the two ticks each window allows for the counters' rounding (and this process's own CPU time).
    assert share == pytest.approx(0.5 - 2 * TICK_S, abs=0.005)
    assert busy(share)


def test_a_core_that_ran_only_the_benchmark_is_quiet() -> None:
    watch = _watch([0, 1], [[5.0, 7.0], [5.3, 7.5]], [0, 800_000_000], [0.0, 1.0])
    watch.start()
    watch.stop()
    assert watch.share() == 0.0
    assert not busy(watch.share())


def test_windows_add_up_and_rounding_is_not_foreign_work() -> None:
    # A quiet second, a second where a neighbour took 0.6 s, and half a second off by one tick of rounding.
    watch = _watch(
        [1],
        [[0.0], [1.0], [1.0], [2.0], [2.0], [2.5 + TICK_S]],
        [0, 1_000_000_000, 1_000_000_000, 1_400_000_000, 1_400_000_000, 1_900_000_000],
        [0.0, 1.0, 1.0, 2.0, 2.0, 2.5],
    )
    for _ in range(3):
        watch.start()
        watch.stop()
    share = watch.share()
    assert share == pytest.approx((0.6 - 2 * TICK_S) / 2.5, abs=0.005)
    assert busy(share)


@pytest.mark.parametrize(
    "busy_s, own_ns",
    [
        ([[1.0], None], [0, 10]),  # the counters do not cover the leased CPU
        ([[1.0], [2.0]], [0, None]),  # a worker's CPU clock could not be read
    ],
)
def test_what_cannot_be_read_is_unknown_not_quiet(busy_s: list[list[float] | None], own_ns: list[int | None]) -> None:
    counters, owns = iter(busy_s), iter(own_ns)
    watch = CoreWatch([1], lambda: next(owns), counters=lambda _: next(counters), clock=time.monotonic)
    watch.start()
    watch.stop()
    assert watch.share() is None
    assert not busy(None)


def test_a_watch_with_no_window_knows_nothing() -> None:
    assert CoreWatch([0], lambda: 0).share() is None


@contextlib.contextmanager
def spinning_neighbours() -> Iterator[None]:
    """A process spinning on each CPU this test may use: the benchmark's leased core is never free."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
        for cpu in sorted(os.sched_getaffinity(0))
    ]
    time.sleep(0.3)
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.fixture
def calibrated(tmp_path: Path) -> None:
    """The machine's bandwidth and noise floor, measured (once per session) before any neighbour spins: no
    calibration is taken beside them."""
    machine_limits(1, tmp_path)
    machine_noise_floor(1, tmp_path)


def test_a_benchmark_beside_a_spinning_neighbour_is_a_busy_machines_reading(tmp_path: Path, calibrated: None) -> None:
    seed = load_problem("softmax").seed_source()
    with spinning_neighbours():
        result = evaluate("softmax", seed, baseline="seed", budget_s=0.3, seeds=1, cache_dir=tmp_path)
    assert result.verdict == Verdict.ok, result.evidence
    report = result.benchmark
    assert report is not None
    # A runnable neighbour on the core takes a good share of it (about 0.3 on the development machine).
    assert report.foreign_cpu_share is not None and report.foreign_cpu_share > FOREIGN_SHARE_BUSY, report
    assert report.shared_cores
    assert any("busy machine" in line and "other work" in line for line in result.evidence), result.evidence


def _measured(key: str, samples: list[LandscapeSample]) -> LandscapeMeasured:
    return LandscapeMeasured(
        recording="r1",
        problem="softmax",
        target="cpu-x",
        fingerprint="f",
        key=key,
        params={"A": 1} if key != "seed" else {},
        candidate_id=f"c-{key}",
        verdict="ok",
        samples=samples,
        budget_s=0.2,
    )


def test_a_landscape_leaves_out_busy_samples_where_a_setting_has_quiet_ones() -> None:
    quiet = LandscapeSample(speedup=2.0, ci_low=1.9, ci_high=2.1)
    lucky = LandscapeSample(speedup=4.0, ci_low=3.0, ci_high=5.0, busy=True)
    closing = LandscapeRecorded(
        recording="r1",
        problem="softmax",
        target="cpu-x",
        fingerprint="f",
        space_size=2,
        settings=2,
        max_settings=None,
        sample_seed=0,
        repeats=2,
        budget_s=0.2,
        seconds=1.0,
        method=1,
    )
    landscape = landscape_from_events(
        [_measured("seed", [quiet]), _measured("A=1", [quiet, lucky]), _measured("A=2", [lucky])], closing
    )
    values = {s.key: s.value for s in landscape.settings}
    # A=1 keeps its quiet reading alone; A=2 was only read busy, so that reading stands in.
    assert values["A=1"] == pytest.approx(2.0)
    assert values["A=2"] == pytest.approx(4.0)


async def test_a_recording_times_a_busy_group_again_and_marks_what_stayed_busy(
    store: EventStore, tmp_path: Path, calibrated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One more try, after a short wait (each timing beside the neighbours takes seconds).
    monkeypatch.setattr(recording, "BUSY_RETRIES", 1)
    monkeypatch.setattr(recording, "BUSY_WAIT_S", 0.1)
    # The neighbours spin while a group is timed (compiling and validating beside them would only be slower).
    time_group = recording._time_group

    def beside_neighbours(*args: Any, **kwargs: Any) -> Any:
        with spinning_neighbours():
            return time_group(*args, **kwargs)

    monkeypatch.setattr(recording, "_time_group", beside_neighbours)
    said: list[str] = []
    plan = RecordingPlan(problem="softmax", max_settings=1, repeats=1, budget_s=0.1)
    landscape = await record_landscape(store, plan, cache_dir=tmp_path, progress=said.append)
    # The group (the seed and one setting) is timed again once, beside the neighbours again, then kept, every
    # sample marked busy.
    assert sum("timing it again" in line for line in said) == 1, said
    stored = await stored_recordings(store, "softmax", landscape.target)
    measured = [p for p in stored.measured_in(landscape.recording).values() if p.verdict == "ok"]
    assert len(measured) == 2 and all(s.busy for p in measured for s in p.samples), measured
    assert any("(busy)" in line for line in said), said


async def test_a_search_says_how_many_of_its_timings_a_busy_machine_took(
    client: Client, store: EventStore, prefix: str, calibrated: None
) -> None:
    # The seed kernel alone, timed while a neighbour spins on every core.
    with spinning_neighbours():
        async with running_worker(client, store, prefix):
            handle = await start(client, prefix, {"problem": COPY_PROBLEM, "budget": {"max_candidates": 1}, **QUICK})
            result = await handle.result()
    events = await store.read_stream(stream_of(handle.id))
    [benchmarked] = [e for e in events if e.type == "candidate.benchmarked"]
    assert benchmarked.payload["output"]["shared_cores"], benchmarked.payload
    assert (result.timings, result.busy_timings) == (1, 1), result
    assert "busy machine: 1 of 1 timings ran while other work used their cores" in format_result(result, False)
    # The follower's last line, drawn from the result, says it too.
    last = SearchStatus.model_validate(
        {
            "search_id": result.search_id,
            "problem": "copy",
            "target": "cpu",
            "target_queue": None,
            "status": "running",
            "generation": 0,
            "generations": 0,
            "candidates_done": 0,
            "verdict_counts": {},
            "best_speedup": None,
            "incumbent": None,
            "incumbent_id": None,
            "llm_spend_usd": 0.0,
            "hints": [],
        }
    )
    assert "1 of 1 timings on a busy machine" in progress_line(final_status(last, result))
