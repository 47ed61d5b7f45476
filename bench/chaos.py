"""Chaos: one search through worker kills, a Temporal restart and a Postgres outage; how honestly it came through.

    .venv/bin/python bench/chaos.py [--json] [--generations 3] [--postgres-outage-s 60]

Starts its own Temporal dev server (SQLite store, so it can be restarted), Postgres (pgserver), a scripted LLM
endpoint and two `kf worker` processes in a temporary folder, then runs the scenario of tests/chaos_fixtures.py:
Temporal killed while a proposal is in flight and restarted, workers and sandboxed harness processes SIGKILLed
again and again, Postgres stopped for a minute. Figures (targets in brackets):
- faults_injected: faults the search went through;
- events_lost [0]: outcomes the record's own summaries imply but the log lacks;
- duplicate_outcomes [0]: a step (or a harness error) recorded twice for one candidate;
- false_verdicts [0]: an infrastructure failure recorded, summarised or counted as a kernel's verdict, or a
  failure verdict that does not hold up when the candidate is judged again with no fault;
- max_stall_s [<= 60]: the longest stretch without a new event while every server was up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos_fixtures import ChaosConfig, run_chaos  # after the path set-up, so it runs from a checkout
from local_stack import stdout_to_stderr


async def main(args: argparse.Namespace) -> dict[str, object]:
    config = ChaosConfig(
        generations=args.generations,
        candidates=args.candidates,
        postgres_outage_s=args.postgres_outage_s,
        temporal_outage_s=args.temporal_outage_s,
    )
    folder = Path(tempfile.mkdtemp(prefix="kf-bench-chaos-"))
    with stdout_to_stderr():
        report = await run_chaos(config, folder)
    figures = report.figures()
    figures["search_id"] = report.search_id
    figures["logs"] = str(folder)
    figures["command"] = "python bench/chaos.py --json"
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=2, help="candidates per generation")
    parser.add_argument("--postgres-outage-s", type=float, default=60.0)
    parser.add_argument("--temporal-outage-s", type=float, default=15.0)
    arguments = parser.parse_args()
    figures = asyncio.run(main(arguments))
    if arguments.json:
        print(json.dumps(figures, indent=2))
    else:
        for name in ("faults_injected", "events_lost", "duplicate_outcomes", "false_verdicts", "max_stall_s"):
            print(f"{name}: {figures[name]}")
        print(f"faults: {figures['faults']}; search {figures['search_status']}, audit clean: {figures['audit_clean']}")
        for line in figures["problems"] or []:  # type: ignore[attr-defined]
            print(f"  {line}")
