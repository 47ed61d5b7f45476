"""Throughput of the event store on the embedded Postgres.

    .venv/bin/python bench/event_store.py [--json] [--single 2000] [--batches 300] [--batch-size 100]

Starts its own Postgres (pgserver, default settings: fsync and synchronous commit on) in a temporary
folder, migrates it, and measures with one writer and one reader:
- append_single_per_s: events/s appending one event per call (each call is one committed transaction);
- append_batch_per_s: events/s appending batches of --batch-size events per call;
- read_per_s: events/s tailing read_all from position 0 in pages of 1000 until the end of the log;
- verify_per_s: events/s of verify() over the whole log (every hash recomputed, every link checked);
  both the median of 3 passes. The machine's load average is printed too: this machine is shared, and
  other processes on its 2 cores lower every figure.
Issue 2's targets: append_batch >= 3000, read >= 50000, verify >= 20000 events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pgserver

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.evidence.events import NewEvent  # after the path set-up, so it runs from a checkout
from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore

PASSES = 3
"""Reads and verifies are repeated (they change nothing) and the median pass is reported."""
TARGETS = {"append_batch_per_s": 3000, "read_per_s": 50000, "verify_per_s": 20000}


def event(n: int) -> NewEvent:
    """A payload shaped like a real verdict: ids, a few numbers, a short list."""
    return NewEvent(
        event_id=f"bench-{n}",
        type="candidate.benchmarked",
        payload={
            "candidate_id": f"{n:064x}",
            "generation": n // 100,
            "ratio": 1.0 + (n % 17) / 100,
            "ci": [0.97, 1.04],
            "samples": 50,
            "verdict": "ok",
        },
        metadata={"workflow_id": "bench", "activity_id": str(n), "attempt": 1, "worker": "bench"},
    )


async def measure(url: str, single: int, batches: int, batch_size: int) -> dict[str, Any]:
    store = await EventStore.connect(url, max_size=2)
    try:
        began = time.perf_counter()
        for n in range(single):
            await store.append(f"single-{n % 50}", [event(n)])
        single_s = time.perf_counter() - began

        base = single
        began = time.perf_counter()
        for b in range(batches):
            first = base + b * batch_size
            await store.append(f"batch-{b % 50}", [event(first + k) for k in range(batch_size)])
        batch_s = time.perf_counter() - began
        total = single + batches * batch_size

        read_s = []
        for _ in range(PASSES):
            began = time.perf_counter()
            cursor, read = 0, 0
            while page := await store.read_all(after_position=cursor, limit=1000):
                cursor = page[-1].position
                read += len(page)
            read_s.append(time.perf_counter() - began)
            assert read == total, (read, total)

        verify_s = []
        for _ in range(PASSES):
            began = time.perf_counter()
            broken = await store.verify()
            verify_s.append(time.perf_counter() - began)
            assert broken is None, broken
    finally:
        await store.close()
    return {
        "append_single_per_s": round(single / single_s),
        "append_batch_per_s": round(batches * batch_size / batch_s),
        "read_per_s": round(total / statistics.median(read_s)),
        "verify_per_s": round(total / statistics.median(verify_s)),
        "events": total,
        "single_appends": single,
        "batches": batches,
        "batch_size": batch_size,
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--single", type=int, default=2000, help="one-event appends to time")
    parser.add_argument("--batches", type=int, default=300, help="batched appends to time")
    parser.add_argument("--batch-size", type=int, default=100, help="events per batched append")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kf-bench-pg-") as folder:
        server = pgserver.get_server(Path(folder), cleanup_mode="delete")
        try:
            url = server.get_uri()
            await migrate(url)
            figures = await measure(url, args.single, args.batches, args.batch_size)
            settings = server.psql("SHOW fsync; SHOW synchronous_commit;").split()
        finally:
            server.cleanup()
    figures["postgres"] = "pgserver, fsync=" + ("on" if "on" in settings[:5] else "off")
    figures["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    figures["targets_met"] = {key: figures[key] >= target for key, target in TARGETS.items()}
    figures["command"] = shlex.join([".venv/bin/python", "bench/event_store.py", *sys.argv[1:]])
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:22} {value}")
    return 0 if all(figures["targets_met"].values()) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
