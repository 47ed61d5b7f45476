"""How fast does a proposal round find a long search's recent failures? ``read_recent_failures`` on a search
stream whose candidates failed thousands of times (an LLM search that keeps writing code that does not compile).

    .venv/bin/python bench/failures_scale.py [--json] [--failures 5000] [--calls 20]

Starts its own Postgres (pgserver) in a temporary folder and appends one search stream of ``--failures``
candidates, each proposed with a 4 KiB source and failing to compile, with a harness failure after every
tenth (which the read skips). Then, over ``--calls`` calls each, with the median and the 10th-90th percentile:

- ``recent_failures_ms``: ``read_recent_failures`` (the newest five, read a page of failures at a time);
- ``all_failures_ms``: the same five found by reading every failure and every failing candidate's proposal
  (what each proposal round read before: it grew with the search);
- ``speedup``: the ratio of the two medians, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from local_stack import local_postgres

from engine.evidence.events import RECORDED_COLUMNS, NewEvent, RecordedEvent
from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore
from engine.proposers.failures import read_recent_failures, recent_failures_from_events

STREAM = "search-failing"

_EVERY_FAILURE = f"""
WITH failed AS (
    SELECT {RECORDED_COLUMNS} FROM events
    WHERE stream_id = $1
      AND (type = 'proposal.failed'
           OR (type = ANY($2::text[]) AND COALESCE(payload -> 'output' ->> 'verdict', 'ok') <> 'ok'))
)
SELECT * FROM failed
UNION ALL
SELECT {RECORDED_COLUMNS} FROM events
WHERE stream_id = $1 AND type = 'candidate.proposed'
  AND payload -> 'candidate' ->> 'candidate_id' IN (SELECT payload ->> 'candidate_id' FROM failed)
ORDER BY stream_version
"""
"""The query each proposal round ran before reading a page at a time: every failure of the search."""
STEPS = ["candidate.compiled", "candidate.validated", "candidate.benchmarked"]


async def fill(store: EventStore, failures: int) -> None:
    """One search stream of ``failures`` failing candidates, appended a generation of 50 at a time."""
    source = "int broken;\n" + "/* padding */\n" * 290
    batch: list[NewEvent] = []
    for n in range(failures):
        cid = f"{n:064d}"
        candidate = {"candidate_id": cid, "source": source, "label": f"llm {n}"}
        batch.append(NewEvent(event_id=f"p{n}", type="candidate.proposed", payload={"candidate": candidate}))
        if n % 10 == 9:
            harness = {"candidate_id": cid, "output": {"verdict": "harness_error"}, "evidence": {}}
            batch.append(NewEvent(event_id=f"b{n}", type="candidate.benchmarked", payload=harness))
        else:
            evidence = {"verdict": "compile_error", "first_error": f"error {n}", "log": "x" * 2000}
            compiled = {"candidate_id": cid, "output": {"verdict": "compile_error"}, "evidence": evidence}
            batch.append(NewEvent(event_id=f"c{n}", type="candidate.compiled", payload=compiled))
        if len(batch) >= 100:
            await store.append(STREAM, batch)
            batch = []
    if batch:
        await store.append(STREAM, batch)


async def timed(calls: int, read: Callable[[], Awaitable[Any]]) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(calls):
        started = time.perf_counter()
        result = await read()
        times.append(1000 * (time.perf_counter() - started))
    return times, result


async def measure(failures: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp, local_postgres(Path(tmp) / "pg") as url:
        await migrate(url)
        store = await EventStore.connect(url)
        try:
            await fill(store, failures)

            async def every_failure() -> Any:
                rows = await store.pool.fetch(_EVERY_FAILURE, STREAM, STEPS)
                return recent_failures_from_events([RecordedEvent.from_row(row) for row in rows])

            # Interleaved rounds, so a load spike on a shared machine lands on both reads alike.
            paged, whole = [], []
            for _ in range(calls):
                t, recent = await timed(1, lambda: read_recent_failures(store, STREAM))
                paged += t
                t, reference = await timed(1, every_failure)
                whole += t
            if recent != reference:
                raise SystemExit("read_recent_failures found other failures than reading them all: a bug")
        finally:
            await store.close()

    def spread(times: list[float]) -> list[float]:
        deciles = statistics.quantiles(times, n=10)
        return [deciles[0], deciles[-1]]

    return {
        "recent_failures_ms": statistics.median(paged),
        "recent_failures_ms_p10_p90": spread(paged),
        "all_failures_ms": statistics.median(whole),
        "all_failures_ms_p10_p90": spread(whole),
        "speedup": statistics.median(whole) / statistics.median(paged),
        "failures": failures,
        "calls": calls,
        "command": f"python bench/failures_scale.py --json --failures {failures} --calls {calls}",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--failures", type=int, default=5000)
    parser.add_argument("--calls", type=int, default=20)
    arguments = parser.parse_args()
    figures = asyncio.run(measure(arguments.failures, arguments.calls))
    if arguments.json:
        print(json.dumps(figures, indent=2))
    else:
        low, high = figures["recent_failures_ms_p10_p90"]
        print(
            f"recent failures of a search with {figures['failures']} failed candidates: "
            f"median {figures['recent_failures_ms']:.1f} ms (p10-p90 {low:.1f}-{high:.1f}); "
            f"reading every failure {figures['all_failures_ms']:.1f} ms ({figures['speedup']:.1f}x slower)"
        )
