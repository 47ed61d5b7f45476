"""How fast are lessons read from a large event log? ``lessons_for`` with 100,000 events in the log.

    .venv/bin/python bench/lessons_scale.py [--json] [--events 100000] [--calls 30]

Starts its own Postgres (pgserver) in a temporary folder and appends synthetic search histories (the event
types and payloads activities/search.py writes, outcomes drawn from the lessons tests' known model:
tests/lessons_fixtures.py) over three problems of one family until the log holds ``--events`` events. Then:

- ``lessons_catch_up_s``: the first ``lessons_for`` after the appends, which folds the whole log into the
  lessons view (once per deployment; afterwards each read folds only what is new);
- ``lessons_ms_at_100k_events``: median wall time of ``lessons_for`` (catch-up of nothing new included, as
  a proposal step calls it) over ``--calls`` calls, with its 10th-90th percentile spread. Target: < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from local_stack import local_postgres

from engine.evidence.lessons import lessons_for
from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lessons_fixtures import TARGET, record_random_search  # the tests' synthetic histories

PROBLEMS = ("softmax", "rmsnorm", "bias_gelu")


async def fill(store: EventStore, events: int) -> int:
    """Append synthetic searches until the log holds at least ``events`` events; returns the count."""
    count, search = 0, 0
    while count < events:
        problem = PROBLEMS[search % len(PROBLEMS)]
        await record_random_search(
            store, f"scale-{search}", problem, seed=search, generations=12, per_generation=8, failure=lambda p: None
        )
        search += 1
        count = int(await store.pool.fetchval("SELECT count(*) FROM events"))
    return count


async def measure(events: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp, local_postgres(Path(tmp) / "pg") as url:
        await migrate(url)
        store = await EventStore.connect(url)
        try:
            started = time.perf_counter()
            total = await fill(store, events)
            fill_s = time.perf_counter() - started
            started = time.perf_counter()
            first = await lessons_for(store, "softmax", TARGET)
            catch_up_s = time.perf_counter() - started
            times = []
            for call in range(calls):
                problem = PROBLEMS[call % len(PROBLEMS)]
                started = time.perf_counter()
                await lessons_for(store, problem, TARGET)
                times.append(1000 * (time.perf_counter() - started))
        finally:
            await store.close()
    deciles = statistics.quantiles(times, n=10)
    return {
        "lessons_ms_at_100k_events": statistics.median(times),
        "lessons_ms_p10_p90": [deciles[0], deciles[-1]],
        "events": total,
        "calls": calls,
        "lessons_catch_up_s": catch_up_s,
        "fill_s": fill_s,
        "candidates_in_lessons": first.candidates,
        "family_candidates_in_lessons": first.family_candidates,
        "command": f"python bench/lessons_scale.py --json --events {events} --calls {calls}",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=30)
    arguments = parser.parse_args()
    figures = asyncio.run(measure(arguments.events, arguments.calls))
    if arguments.json:
        print(json.dumps(figures, indent=2))
    else:
        print(
            f"lessons_for with {figures['events']} events: median {figures['lessons_ms_at_100k_events']:.1f} ms "
            f"(p10-p90 {figures['lessons_ms_p10_p90'][0]:.1f}-{figures['lessons_ms_p10_p90'][1]:.1f} ms); "
            f"first read (folds the log) {figures['lessons_catch_up_s']:.1f} s"
        )
