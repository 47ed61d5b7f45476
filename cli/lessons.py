"""``kf lessons [--problem P] [--target T] [--json]``: what the evidence log teaches, per problem and target."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from cli.options import problem_name, target
from engine.connections import database_url
from engine.evidence.lessons import Lessons, family_targets, known_lessons, lessons_for, problem_key
from engine.evidence.store import EventStore


def register(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "lessons",
        help="lessons learned from the evidence: per change, compile and correct rates, speedup over parent",
        description=(
            "Catch the lessons projection up with the event log and print the lessons for each problem and "
            "target (a problem's own evidence, plus its family's at half weight)."
        ),
    )
    command.add_argument(
        "--problem",
        type=problem_name,
        default=None,
        help="a problem name (default: every problem with lessons)",
    )
    command.add_argument(
        "--target",
        type=target,
        default=None,
        help="a target, e.g. cpu-x86_64-avx512 or cpu for this machine (default: all)",
    )
    command.add_argument("--database-url", default=None, help="Postgres URL (default: KF_DATABASE_URL or `kf up`)")
    command.add_argument("--json", action="store_true", help='print {"lessons": [...]} with priors and rows')
    command.set_defaults(handler=run_lessons)


async def collect_lessons(url: str, problem: str | None, target: str | None) -> list[Lessons]:
    """The lessons for the problem and target asked for; every known pair when one is left out."""
    store = await EventStore.connect(url, max_size=2)
    try:
        pairs = await known_lessons(store, target)
        if problem is not None:
            problem = problem_key(problem)
            if target is not None:
                pairs = [(problem, target)]  # its own lessons, its family's, or none yet: said for what was asked
            else:
                # Every target where the problem or its family has lessons: a problem never searched itself
                # still learns from its relatives.
                pairs = [(problem, t) for t in await family_targets(store, problem)]
        return [await lessons_for(store, p, t, catch_up=False) for p, t in pairs]
    finally:
        await store.close()


def run_lessons(args: argparse.Namespace) -> int:
    url = args.database_url or database_url()
    found = asyncio.run(collect_lessons(url, args.problem, args.target))
    if args.json:
        print(json.dumps({"lessons": [lesson.model_dump(mode="json") for lesson in found]}))
        return 0
    if not found:
        asked = " ".join(f"{k} {v}" for k, v in (("for", args.problem), ("on", args.target)) if v)
        print(f"no lessons yet{(' ' + asked) if asked else ''}: run a search first (kf search start softmax --wait)")
        return 0
    print("\n\n".join(lesson.summary for lesson in found))
    return 0
