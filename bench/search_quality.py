"""Search quality: how close each proposer gets to a problem's best setting within a few evaluations, replayed
against recorded landscapes, with Kernel Tuner's own strategies as the peer.

    .venv/bin/python bench/search_quality.py [--json] [--problems softmax,rmsnorm] [--repetitions 200]
        [--record] [--max-settings 128] [--stale-ok] [--no-kernel-tuner] [--transfer-repetitions 50]
        [--first-seed 0]

1. Landscapes (engine/replay/landscape.py, recording.py): every setting of each problem's CPU template space
   (a seeded sample of --max-settings when the space is larger), and the seed kernel, compiled, validated
   and timed against numpy --record-repeats times on this machine, kept as events in a private event log
   (a pgserver Postgres under $KF_HOME/bench/landscapes, or --database-url). A later run reuses the newest
   recording of the problem's current definition (its fingerprint) taken by the judge's current measurement
   method (engine/harness/verdicts.py); --record records a new take; a recording that stopped half-way is
   resumed. --stale-ok replays the newest recording of an older definition or method when the current one
   has none (its settings that are still in the space).
2. Replay (engine/replay/simulation.py): each proposer searches as a KernelSearch would -- generations of
   --per-generation candidates from a ProposalContext with the search's seed, its incumbent, what it has
   seen and lessons built from its own replayed outcomes (engine/evidence/lessons.build_lessons, as the
   lessons projection would fold them) -- but each evaluation draws one recorded benchmark of the setting
   (a failed setting replays its verdict) instead of measuring, and promotion follows the search's rule.
   --repetitions searches per proposer and problem, each with its own seed: --first-seed and the ones after
   it. The same seeds replay the same searches, so two proposers (or two versions of one) are compared on the
   same draws; another --first-seed replays another set, which says whether a difference is more than the
   seeds.
3. Kernel Tuner's strategies (random_sample, genetic_algorithm, simulated_annealing, greedy_ils, bayes_opt,
   … per --kernel-tuner-strategies) search the same settings in its simulation mode, through a cache file
   exported from the landscape (engine/replay/kernel_tuner_cache.py): one per repetition, each setting's
   time one recorded sample drawn at random, so they see the same noise as the proposers. A strategy that
   raises on some seeds (its own failure, e.g. greedy_ils on a sparse sample) gets no figure at that budget and
   says so in kernel_tuner_failures: the seeds it survived would be a biased sample of it.

Figures (engine/replay/scoring.py), with v(s) a setting's value on the landscape (the geometric mean of its
recorded speedups over numpy) and best(b) = max(v(seed), max of v over the correct settings among the first
b evaluated):
- score[proposer][problem][b] = (E[best(b)] - R(b)) / (optimum - R(b)), where E is the mean over the
  repetitions, R(b) is the exact expectation of best(b) for b settings drawn uniformly without
  replacement (random search), and optimum = max(v(seed), max v): 0 is random search's expected best, 1
  the landscape's optimum, negative worse than random (Kernel Tuner's methodology, in speedup terms);
- score_interval[proposer][problem][b]: its 95% confidence interval over the repetitions' seeds
  (engine/replay/scoring.py): two proposers' scores differ only where their intervals part;
- share_of_optimum[proposer][problem][b]: E[best(b)] / optimum, and random_share_of_optimum[problem][b] =
  R(b) / optimum: where the score's 0 and 1 lie. Where random search's best is already within a few percent of
  the optimum, a search that ends a few percent short scores low; these say how short;
- evals_to_95pct[proposer][problem]: the median over repetitions of the evaluations until a setting with
  v >= 0.95 × optimum was evaluated (null when more than half the repetitions did not: within --horizon
  evaluations for our proposers, within the largest budget for Kernel Tuner's; evals_to_95pct_within);
- warm[problem]: the warm starts of --transfer-proposer (by default gp, a search's default): pairs of a cold
  search and a second search with another seed on the cold one's lessons (16 evaluations each, a quarter of
  --repetitions pairs): remeasured_mean (the warm search's evaluations that measured a setting the cold one had
  measured), new_settings_share, beats_cold_share (the warm search found a better setting than the cold one),
  best_vs_cold_mean;
- transfer[problem], for each problem with other problems of its family in the run: leave-one-out transfer,
  replayed (--transfer-repetitions, by default a quarter of --repetitions). Each repetition replays a cold
  search of each of the family's other problems (16 evaluations on its landscape), then a search of the
  problem whose only lessons are theirs, with the seed of the cold search it is compared with:
  evals_to_95pct_cold and evals_to_95pct_transfer (medians, as evals_to_95pct), transfer_vs_cold (their
  ratio: below 1, transfer saved evaluations), score_cold and score_transfer by budget; the same figures by
  problem as evals_to_95pct_transfer and transfer_vs_cold, and transfer_target (how many problems meet
  transfer <= 0.75 x cold). bench/self_improvement.py measures the same with real searches, once per
  repetition;
- landscapes[problem]: its settings, space size, failures, optimum, recording and whether it is stale; how
  firm its optimum is: best_setting_readings (that setting's recorded speedups), within_95pct (settings whose
  value is within 5% of the optimum) and reading_range_median / reading_range_p90 (over the settings, the
  fastest of a setting's readings over its slowest). With few readings that disagree, the optimum is as much
  the luckiest setting as the fastest, and every score is measured against it: record again with more
  --record-repeats.
"""

from __future__ import annotations

import os

# One BLAS thread: the surrogate fits are small, and a loaded machine makes threaded BLAS ten times slower.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernel_tuner_peer  # after the path set-up
from local_stack import local_postgres
from problem_args import problem_list

from engine.config import kf_home
from engine.evidence.migrations import migrate
from engine.evidence.store import EventStore
from engine.harness.verdicts import measurement_method
from engine.problems import Problem, builtin_problems, load_problem
from engine.proposers import RandomTemplateProposer, SearchProposer
from engine.proposers.base import Proposer
from engine.proposers.gp import GaussianProcessProposer, GPConfig
from engine.replay.landscape import Landscape, stored_recordings
from engine.replay.recording import DEFAULT_BUDGET_S, DEFAULT_REPEATS, RecordingPlan, record_landscape
from engine.replay.scoring import (
    best_at,
    median_evals_to,
    random_expected_best,
    score,
    score_interval,
    share_of_optimum,
)
from engine.replay.simulation import DEFAULT_PER_GENERATION, ReplayLessons, recorded_space, replay_search
from engine.search.spec import ProposerSettings

DEFAULT_MAX_SETTINGS = 128
"""Settings recorded per problem by default: whole spaces up to this size, a seeded sample of larger ones."""

BUDGETS = (8, 16, 32)
"""Evaluation budgets scored (template settings evaluated; the seed kernel does not count)."""

WARM_BUDGET = 16
"""Evaluations of each of the cold and the warm search in the warm-start figures."""

WARM_REPETITIONS_DIVISOR = 4
"""Warm pairs run per problem: a quarter of --repetitions (each pair is two searches)."""

WARM_SEED_OFFSET = 100_003
"""Added to a cold search's seed for the warm search that follows it: another search, another seed."""

TRANSFER_SOURCE_BUDGET = 16
"""Evaluations of each cold search of another family problem whose lessons a leave-one-out transfer search
starts from (about what bench/self_improvement.py gives each cold search: 12-14)."""

TRANSFER_SEED_OFFSET = 500_009
"""Added to a transfer search's seed for the source searches before it: their own seeds, not the target's."""

TRANSFER_TARGET = 0.75
"""Issue 12's target: a transfer search reaches 95% of the optimum in at most this fraction of the
evaluations a cold search needs, on most of the family's problems."""

MAX_TIMEOUTS = 3
"""Kernel Tuner searches of one strategy on one problem that may time out before the rest are skipped."""

PROPOSERS: dict[str, type[Proposer]] = {
    "random": RandomTemplateProposer,
    "search": SearchProposer,
    "gp": GaussianProcessProposer,
}
"""Our proposers replayed (the offline ones: the LLM proposers need a model)."""


class UncoveredGaussianProcessProposer(GaussianProcessProposer):
    """gp without its covering phase (``GPConfig.cover`` off): what gp's docstring compares coverage against."""

    config = replace(GPConfig(), cover=False)


ABLATIONS: dict[str, type[Proposer]] = {"gp-uncovered": UncoveredGaussianProcessProposer}
"""Variants of our proposers whose figures a docstring quotes: replayed only when --proposers names them."""


def proposer_class(name: str) -> type[Proposer]:
    return {**PROPOSERS, **ABLATIONS}[name]


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def landscape_store(database_url: str | None) -> AsyncIterator[EventStore]:
    """The event log landscapes are kept in: ``database_url``, else a private pgserver Postgres that lives
    on under $KF_HOME/bench/landscapes between runs."""
    async with contextlib.AsyncExitStack() as stack:
        if database_url is None:
            folder = kf_home() / "bench" / "landscapes"
            # KF_HOME defaults to ./.kf: run from another folder, this finds none of the landscapes recorded before
            # and records them again (about ten minutes a problem), so where they are looked for is said first.
            say(f"landscapes: {folder} (set KF_HOME or --database-url to use those recorded elsewhere)")
            folder.parent.mkdir(parents=True, exist_ok=True)
            database_url = stack.enter_context(local_postgres(folder))
        await migrate(database_url)
        store = await EventStore.connect(database_url)
        stack.push_async_callback(store.close)
        yield store


async def landscapes(args: argparse.Namespace, problems: list[str]) -> dict[str, tuple[Landscape, bool]]:
    """The landscape of each problem and whether it is stale (recorded for an older definition, or by an older
    measurement method of the judge): recorded
    now, or reused from the log."""
    found: dict[str, tuple[Landscape, bool]] = {}
    async with landscape_store(args.database_url) as store:
        for name in problems:
            problem = load_problem(name)
            if args.stale_ok and not args.record:
                stored = await stored_recordings(store, problem.name, _target())
                current = stored.latest(problem.fingerprint(), method=measurement_method(_target()))
                older = stored.latest()
                if current is None and older is not None:
                    say(
                        f"{name}: replaying a recording of an older definition or measurement method "
                        f"({older.recording})"
                    )
                    found[name] = (older, True)
                    continue
            plan = RecordingPlan(
                problem=name,
                max_settings=args.max_settings or None,
                repeats=args.record_repeats,
                budget_s=args.record_budget,
                force=args.record,
            )
            found[name] = (await record_landscape(store, plan), False)
    for name, (landscape, _) in found.items():
        if landscape.repeats < DEFAULT_REPEATS:
            # A reused recording keeps the readings it was taken with (see DEFAULT_REPEATS for why few mislead).
            say(
                f"{name}: recording {landscape.recording} has {landscape.repeats} readings per setting, fewer "
                f"than {DEFAULT_REPEATS}: its optimum may be a lucky reading. Record it again with --record "
                f"--problems {name}"
            )
    return found


def _target() -> str:
    from engine.hardware import cpu_target

    return cpu_target()


def replay_proposer(
    name: str,
    problem: Problem,
    landscape: Landscape,
    repetitions: int,
    horizon: int,
    per_generation: int,
    first_seed: int = 0,
) -> list[list[float | None]]:
    """The landscape values of each replayed search's evaluations, in order; the searches' seeds are
    ``first_seed`` and the ``repetitions - 1`` after it."""
    make = proposer_class(name)
    return [
        [
            e.value
            for e in replay_search(
                make(), problem, landscape, evaluations=horizon, seed=seed, per_generation=per_generation
            )
        ]
        for seed in range(first_seed, first_seed + repetitions)
    ]


def replay_warm(
    name: str,
    problem: Problem,
    landscape: Landscape,
    repetitions: int,
    budget: int,
    per_generation: int,
    first_seed: int = 0,
) -> dict[str, float]:
    """Warm searches: each repetition runs a cold search of ``budget`` evaluations, then a second search with
    another seed that sees the first one's lessons (as a later search on the same log does; it starts from
    the seed kernel, as a search without resume_from does). Per repetition, how many of the warm search's
    evaluations measured again a setting the cold search had measured, and whether its best setting is
    better than the cold search's."""
    make = proposer_class(name)
    remeasured: list[int] = []
    beats: list[bool] = []
    ratio: list[float] = []
    for seed in range(first_seed, first_seed + repetitions):
        lessons = ReplayLessons(recorded_space(problem, landscape), landscape.target)
        cold = replay_search(
            make(), problem, landscape, evaluations=budget, seed=seed, per_generation=per_generation, lessons=lessons
        )
        warm = replay_search(
            make(),
            problem,
            landscape,
            evaluations=budget,
            seed=seed + WARM_SEED_OFFSET,
            per_generation=per_generation,
            lessons=lessons,
        )
        measured = {e.key for e in cold}
        remeasured.append(sum(e.key in measured for e in warm))
        cold_best = best_at([e.value for e in cold], budget, landscape.floor)
        warm_best = best_at([e.value for e in warm], budget, landscape.floor)
        beats.append(warm_best > cold_best)
        ratio.append(warm_best / cold_best)
    return {
        "remeasured_mean": statistics.fmean(remeasured),
        "new_settings_share": 1.0 - statistics.fmean(remeasured) / budget,
        "beats_cold_share": statistics.fmean(beats),
        "best_vs_cold_mean": statistics.fmean(ratio),
    }


def transfer_sources(problem: Problem, found: dict[str, tuple[Landscape, bool]]) -> list[str]:
    """The other problems of ``problem``'s family among the landscapes of this run, by name."""
    return sorted(name for name in found if name != problem.name and load_problem(name).family == problem.family)


def replay_transfer(
    problem: Problem,
    landscape: Landscape,
    sources: list[tuple[Problem, Landscape]],
    repetitions: int,
    horizon: int,
    per_generation: int,
    first_seed: int = 0,
    proposer: str = "search",
) -> list[list[float | None]]:
    """Leave-one-out transfer by ``proposer`` (the source searches' and the transfer search's): each repetition
    replays a cold search of each source problem (another problem of the family, TRANSFER_SOURCE_BUDGET
    evaluations on its own landscape), then a search of ``problem`` whose only lessons are theirs, as a first
    search of a problem on a log its family has searched before would see them. Its seed is the cold search's
    of the same repetition (replay_proposer), so the two differ only by the lessons. The landscape values of
    each transfer search's evaluations, in order."""
    runs: list[list[float | None]] = []
    for seed in range(first_seed, first_seed + repetitions):
        family: list[ReplayLessons] = []
        for source, source_landscape in sources:
            lessons = ReplayLessons(recorded_space(source, source_landscape), source_landscape.target)
            replay_search(
                proposer_class(proposer)(),
                source,
                source_landscape,
                evaluations=TRANSFER_SOURCE_BUDGET,
                seed=seed + TRANSFER_SEED_OFFSET,
                per_generation=per_generation,
                lessons=lessons,
            )
            family.append(lessons)
        lessons = ReplayLessons(recorded_space(problem, landscape), landscape.target, family=family)
        search = replay_search(
            proposer_class(proposer)(),
            problem,
            landscape,
            evaluations=horizon,
            seed=seed,
            per_generation=per_generation,
            lessons=lessons,
        )
        runs.append([e.value for e in search])
    return runs


def transfer_row(
    problem: Problem,
    landscape: Landscape,
    found: dict[str, tuple[Landscape, bool]],
    sources: list[str],
    cold: list[list[float | None]],
    horizon: int,
    per_generation: int,
    first_seed: int = 0,
    proposer: str = "search",
) -> dict[str, Any]:
    """One family problem's transfer figures: its cold searches (the first ``len(cold)`` repetitions of the
    search proposer's replay, seeds from ``first_seed``) against as many leave-one-out transfer searches with
    the same seeds."""
    runs = replay_transfer(
        problem,
        landscape,
        [(load_problem(s), found[s][0]) for s in sources],
        len(cold),
        horizon,
        per_generation,
        first_seed,
        proposer,
    )
    cold_evals = median_evals_to(landscape, cold, 0.95)
    transfer_evals = median_evals_to(landscape, runs, 0.95)
    return {
        "sources": sources,
        "repetitions": len(runs),
        "evals_to_95pct_cold": cold_evals,
        "evals_to_95pct_transfer": transfer_evals,
        "transfer_vs_cold": (
            None if cold_evals is None or transfer_evals is None else round(transfer_evals / cold_evals, 3)
        ),
        "score_cold": {str(b): score(landscape, cold, b) for b in BUDGETS},
        "score_transfer": {str(b): score(landscape, runs, b) for b in BUDGETS},
    }


def transfer_target(transfer: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How many family problems' transfer searches reach the mark in at most TRANSFER_TARGET of the cold
    searches' evaluations (median over repetitions each)."""
    met = sorted(
        name
        for name, row in transfer.items()
        if row["transfer_vs_cold"] is not None and row["transfer_vs_cold"] <= TRANSFER_TARGET
    )
    return {"count": len(met), "of": len(transfer), "ratio": TRANSFER_TARGET, "problems": met}


def replay_kernel_tuner(
    strategy: str, landscape: Landscape, repetitions: int, budgets: list[int], first_seed: int = 0
) -> tuple[dict[int, list[list[float | None]]], list[str]]:
    """Per budget, the landscape values of each Kernel Tuner search (max_fevals = the budget; seeds from
    ``first_seed``), and the errors of the searches that raised (a strategy's own failure, e.g. on a sparse
    sampled space). A budget where any search raised keeps no searches, so it gets no score: the searches that
    did not raise are those that happened to avoid what sank the others (greedy_ils raises where a setting has no
    neighbour one change away in the sample), and two survivors of thirty once scored 0.98 where the strategy as
    a whole has no figure."""
    runs: dict[int, list[list[float | None]]] = {}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kf-kt-") as folder:
        for budget in budgets:
            runs[budget] = []
            for seed in range(first_seed, first_seed + repetitions):
                if sum("TimeoutError" in e for e in errors) >= MAX_TIMEOUTS:
                    errors.append(f"budget {budget} seed {seed}: skipped after {MAX_TIMEOUTS} searches timed out")
                    continue
                try:
                    keys = kernel_tuner_peer.run_strategy(landscape, strategy, budget, seed, Path(folder))
                except Exception as error:  # Kernel Tuner's own failure: reported, never ours to fix
                    errors.append(f"budget {budget} seed {seed}: {type(error).__name__}: {error}")
                    continue
                runs[budget].append(kernel_tuner_peer.values_of(landscape, keys))
            if len(runs[budget]) < repetitions:
                runs[budget] = []
    return runs, errors


def describe(landscape: Landscape, stale: bool) -> dict[str, Any]:
    values = landscape.values()
    best = max(landscape.settings, key=lambda s: s.value or 0.0)
    ranges = sorted(r for s in landscape.settings if (r := s.reading_range) is not None)
    return {
        "settings": len(landscape.settings),
        "space_size": landscape.space_size,
        "failed": sum(v is None for v in values),
        "optimum": landscape.optimum,
        "best_setting": best.key,
        # How firm the score's 1 is: the optimum's own readings, and how far a setting's readings disagree.
        "best_setting_readings": [round(s.speedup, 4) for s in best.samples],
        "reading_range_median": round(statistics.median(ranges), 4) if ranges else None,
        "reading_range_p90": round(ranges[int(0.9 * (len(ranges) - 1))], 4) if ranges else None,
        "within_95pct": sum(v is not None and v >= 0.95 * landscape.optimum for v in values),
        "seed_value": landscape.floor,
        "median_value": statistics.median(v for v in values if v is not None) if any(values) else None,
        "random_expected_best": {str(b): random_expected_best(landscape, b) for b in BUDGETS},
        "recording": landscape.recording,
        "fingerprint": landscape.fingerprint,
        "stale": stale,
        "repeats": landscape.repeats,
        "budget_s": landscape.budget_s,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--problems", default=",".join(builtin_problems("cpu")), help="comma-separated problem names")
    parser.add_argument("--record", action="store_true", help="record a new take of every landscape")
    parser.add_argument("--record-only", action="store_true", help="record (or check) the landscapes, replay nothing")
    parser.add_argument("--stale-ok", action="store_true", help="replay an older definition's recording if need be")
    parser.add_argument("--max-settings", type=int, default=DEFAULT_MAX_SETTINGS, help="0: the whole space")
    parser.add_argument("--record-repeats", type=int, default=DEFAULT_REPEATS, help="benchmarks per setting")
    parser.add_argument("--record-budget", type=float, default=DEFAULT_BUDGET_S, help="seconds per benchmark")
    parser.add_argument("--database-url", default=os.environ.get("KF_LANDSCAPE_DATABASE_URL") or None)
    parser.add_argument("--repetitions", type=int, default=200, help="replayed searches per proposer and problem")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seed of the first replayed search (the others follow it): another set of searches, to see "
        "whether a difference between two runs is more than which seeds they drew",
    )
    parser.add_argument("--per-generation", type=int, default=DEFAULT_PER_GENERATION)
    parser.add_argument("--horizon", type=int, default=48, help="evaluations per replayed search (for evals_to_95pct)")
    parser.add_argument(
        "--proposers",
        default=",".join(PROPOSERS),
        help=f"comma-separated, of {', '.join(PROPOSERS)} (default all) and the ablations {', '.join(ABLATIONS)}",
    )
    parser.add_argument("--kernel-tuner-strategies", default=",".join(kernel_tuner_peer.STRATEGIES))
    parser.add_argument("--kernel-tuner-repetitions", type=int, default=50)
    parser.add_argument("--no-kernel-tuner", action="store_true")
    parser.add_argument(
        "--transfer-repetitions",
        type=int,
        default=None,
        help="leave-one-out transfer searches per family problem (default: a quarter of --repetitions; 0: none)",
    )
    default_kind = ProposerSettings().kind
    parser.add_argument(
        "--transfer-proposer",
        default=default_kind,
        help=f"the proposer whose warm starts and leave-one-out transfer are replayed (default: {default_kind}, the "
        "one a search uses unless told otherwise)",
    )
    args = parser.parse_args(argv)
    if args.first_seed < 0:
        # numpy's generators take no negative seed, and would say so only after the landscapes were loaded.
        parser.error(f"--first-seed {args.first_seed}: a seed is 0 or more")
    known = {**PROPOSERS, **ABLATIONS}
    for who in [*args.proposers.split(","), args.transfer_proposer]:
        if who and who not in known:
            parser.error(f"--proposers/--transfer-proposer: no proposer {who!r}; pass some of {', '.join(known)}")
    problems = list(problem_list(parser, "--problems", args.problems))
    command = "python bench/search_quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    found = asyncio.run(landscapes(args, problems))
    figures: dict[str, Any] = {
        "landscapes": {name: describe(land, stale) for name, (land, stale) in found.items()},
        "budgets": list(BUDGETS),
        "command": command,
    }
    if args.record_only:
        return figures
    budgets = list(BUDGETS)
    scores: dict[str, dict[str, dict[str, float | None]]] = {}
    intervals: dict[str, dict[str, dict[str, list[float] | None]]] = {}
    shares: dict[str, dict[str, dict[str, float | None]]] = {}
    evals: dict[str, dict[str, float | None]] = {}
    seconds: dict[str, dict[str, float]] = {}
    failures: dict[str, dict[str, str]] = {}
    warm: dict[str, dict[str, float]] = {}
    transfer: dict[str, dict[str, Any]] = {}
    transfer_reps = (
        args.transfer_repetitions
        if args.transfer_repetitions is not None
        else max(args.repetitions // WARM_REPETITIONS_DIVISOR, 1)
    )

    def scored(who: str, name: str, landscape: Landscape, by_budget: dict[int, list[list[float | None]]]) -> None:
        scores.setdefault(who, {})[name] = {str(b): score(landscape, by_budget[b], b) for b in budgets}
        shares.setdefault(who, {})[name] = {
            str(b): None if (x := share_of_optimum(landscape, by_budget[b], b)) is None else round(x, 4)
            for b in budgets
        }
        intervals.setdefault(who, {})[name] = {
            str(b): None if (ci := score_interval(landscape, by_budget[b], b)) is None else [round(x, 3) for x in ci]
            for b in budgets
        }
        longest = by_budget[max(by_budget)]
        evals.setdefault(who, {})[name] = median_evals_to(landscape, longest, 0.95)

    for name, (landscape, _) in found.items():
        problem = load_problem(name)
        horizon = max(args.horizon, *budgets)
        for who in [p for p in args.proposers.split(",") if p]:
            began = time.perf_counter()
            runs = replay_proposer(
                who, problem, landscape, args.repetitions, horizon, args.per_generation, args.first_seed
            )
            seconds.setdefault(who, {})[name] = (time.perf_counter() - began) / max(args.repetitions, 1)
            scored(who, name, landscape, {b: runs for b in budgets} | {horizon: runs})
            say(
                f"{name} {who}: score {scores[who][name]} (95% {intervals[who][name]}), "
                f"share_of_optimum {shares[who][name]}, evals_to_95pct {evals[who][name]}"
            )
            if who == args.transfer_proposer:
                reps = max(args.repetitions // WARM_REPETITIONS_DIVISOR, 1)
                warm[name] = replay_warm(
                    who, problem, landscape, reps, WARM_BUDGET, args.per_generation, args.first_seed
                )
                say(f"{name} {who} warm: {warm[name]}")
                sources = transfer_sources(problem, found)
                if sources and transfer_reps > 0:
                    transfer[name] = transfer_row(
                        problem,
                        landscape,
                        found,
                        sources,
                        runs[:transfer_reps],
                        horizon,
                        args.per_generation,
                        args.first_seed,
                        who,
                    )
                    say(f"{name} transfer from {', '.join(sources)}: {transfer[name]}")
        why_not = kernel_tuner_peer.available()
        if args.no_kernel_tuner or why_not:
            figures["kernel_tuner"] = "not run" if args.no_kernel_tuner else f"not available: {why_not}"
            continue
        for strategy in [s for s in args.kernel_tuner_strategies.split(",") if s]:
            who = f"kernel_tuner:{strategy}"
            began = time.perf_counter()
            by_budget, errors = replay_kernel_tuner(
                strategy, landscape, args.kernel_tuner_repetitions, budgets, args.first_seed
            )
            if errors:
                failures.setdefault(who, {})[name] = (
                    f"{len(errors)} searches raised (no score at a budget where any did), e.g. {errors[0][:200]}"
                )
            seconds.setdefault(who, {})[name] = (time.perf_counter() - began) / max(args.kernel_tuner_repetitions, 1)
            scored(who, name, landscape, by_budget)
            say(
                f"{name} {who}: score {scores[who][name]} (95% {intervals[who][name]}), "
                f"share_of_optimum {shares[who][name]}, evals_to_95pct {evals[who][name]}"
            )
    figures |= {
        "score": scores,
        "score_interval": intervals,
        "share_of_optimum": shares,
        "random_share_of_optimum": {
            name: {str(b): round(random_expected_best(landscape, b) / landscape.optimum, 4) for b in budgets}
            for name, (landscape, _) in found.items()
            if landscape.optimum > 0
        },
        "evals_to_95pct": evals,
        "repetitions": {"proposers": args.repetitions, "kernel_tuner": args.kernel_tuner_repetitions},
        "first_seed": args.first_seed,
        # evals_to_95pct looks this far: a replayed proposer's searches run to the horizon, Kernel Tuner's
        # to the largest budget (its strategies size themselves by max_fevals).
        "evals_to_95pct_within": {"proposers": max(args.horizon, *budgets), "kernel_tuner": max(budgets)},
        "per_generation": args.per_generation,
        "seconds_per_search": seconds,
        "kernel_tuner_failures": failures,
        "warm": warm,
        "transfer": transfer,
        "evals_to_95pct_transfer": {name: row["evals_to_95pct_transfer"] for name, row in transfer.items()},
        "transfer_vs_cold": {name: row["transfer_vs_cold"] for name, row in transfer.items()},
        "transfer_target": transfer_target(transfer),
    }
    figures["targets"] = targets(scores)
    return figures


def targets(scores: dict[str, dict[str, dict[str, float | None]]]) -> dict[str, Any]:
    """Whether the search proposer scores >= 0.7 at budget 16 on every problem, and beats random and the best
    Kernel Tuner strategy at every budget on every problem (a list of the misses)."""
    search = scores.get("search", {})
    misses: list[str] = []
    for problem, by_budget in search.items():
        at16 = by_budget.get("16")
        if at16 is None or at16 < 0.7:
            misses.append(f"{problem}: score {at16} < 0.7 at budget 16")
        for budget, value in by_budget.items():
            rivals = {who: s[problem][budget] for who, s in scores.items() if who != "search" and problem in s}
            for who, rival in rivals.items():
                if who != "random" and not who.startswith("kernel_tuner:"):
                    continue
                if value is not None and rival is not None and value <= rival:
                    misses.append(f"{problem} budget {budget}: search {value:.3f} <= {who} {rival:.3f}")
    return {"met": not misses and bool(search), "misses": misses}


if __name__ == "__main__":
    result = main()
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {json.dumps(value)}")
