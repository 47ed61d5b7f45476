"""Replaying a search against a recorded landscape: what a proposer would find, without compiling,
measuring or a Temporal server.

The replay follows a KernelSearch (workflows/kernel_search.py) step by step:

- generation 0 evaluates the seed kernel, the first incumbent;
- each later generation asks the proposer for ``per_generation`` candidates with the ProposalContext the
  propose activity would build: the search's seed and generation, its incumbent, every candidate it has
  seen, and lessons built from its own outcomes so far (:class:`ReplayLessons` folds them the way the
  lessons projection folds a search's events, and engine/evidence/lessons.py's ``build_lessons`` turns
  them into the Lessons a proposer sees);
- each candidate's evaluation draws one recorded benchmark of its setting (a failed setting replays its
  verdict), and its speedup over the incumbent is the ratio of its draw to a fresh draw of the incumbent's
  with both intervals' half-widths added in quadrature (in log space);
- the generation's fastest shaky readings are re-measured first (another recorded benchmark each, folded as
  another reading), as the search re-measures them (PromotionPolicy.steering_remeasures);
- the generation's promotion follows the search's rule (engine/search/promotion.py).

The proposer sees only the recorded settings of the template space (a capped landscape is a sample): the
replay hands it the problem with ``template_allows`` restricted to them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.evidence.lessons import _Row, build_lessons
from engine.evidence.lessons_projection import ALL, LESSON_SAMPLES, changes_of, reading_halfwidth
from engine.harness.verdicts import measurement_method
from engine.problems import Problem
from engine.proposers.base import ProposalContext, Proposer
from engine.replay.landscape import Landscape, Outcome, Setting, setting_key
from engine.search.candidates import Candidate
from engine.search.promotion import choose_promotion, readings_to_remeasure
from engine.search.spec import PromotionPolicy
from engine.search.state import CandidateOutcome

DEFAULT_PER_GENERATION = 4
"""Candidates per generation: a search's default (SearchSpec.candidates_per_generation)."""

REPLAYED_MACHINE = "replayed"
"""The machine key of a replayed search and of its replayed readings: one machine, the one that recorded the
landscape, so a warm replay's evidence settles settings as a warm search's on that machine would."""


@dataclass(frozen=True)
class RecordedSpace(Problem):
    """A problem as a replay shows it to proposers: its template space is the landscape's recorded settings.

    The parameters and values are the recorded ones (a landscape of an older definition of the problem
    replays as it was recorded), and a setting renders to a stand-in source naming it: candidates keep
    distinct content ids, and a replay never reads, renders or hashes a real template."""

    recorded_params: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """Each parameter with its values."""
    recorded: frozenset[str] | None = None
    """setting_key of each allowed setting; None: every combination of the values."""

    @property
    def template_params(self) -> dict[str, list[Any]]:
        return {name: list(values) for name, values in self.recorded_params}

    def template_allows(self, params: dict[str, Any]) -> bool:
        return self.recorded is None or setting_key(params) in self.recorded

    def allowed(self, settings: list[dict[str, Any]]) -> list[bool]:
        return [self.template_allows(s) for s in settings]

    def render_template(self, params: dict[str, Any]) -> str:
        return f"/* {self.name}: replayed template setting {setting_key(params)} */\n"

    def space_identity(self) -> Hashable:
        return (super().space_identity(), self.recorded_params, self.recorded)


def fixed_space(
    problem: Problem, params: dict[str, list[Any]], allowed: Iterable[dict[str, Any]] | None = None
) -> RecordedSpace:
    """``problem`` with the template space ``params`` (every combination, or only the ``allowed`` settings),
    whatever its folder declares today: what replays and proposer tests search."""
    fields = {f.name: getattr(problem, f.name) for f in dataclasses.fields(Problem)}
    return RecordedSpace(
        **fields,
        recorded_params=tuple((name, tuple(values)) for name, values in sorted(params.items())),
        recorded=None if allowed is None else frozenset(setting_key(p) for p in allowed),
    )


def recorded_space(problem: Problem, landscape: Landscape) -> RecordedSpace:
    """``problem`` seen through ``landscape``: only its recorded settings are allowed. Values keep the order
    the problem declares them in (recorded values it no longer declares come after, sorted)."""
    declared = problem.template_params
    values: dict[str, list[Any]] = {}
    for setting in landscape.settings:
        for name, value in setting.params.items():
            known = values.setdefault(name, [])
            if value not in known:
                known.append(value)

    def rank(name: str, value: Any) -> tuple[int, int, str]:
        order = declared.get(name, [])
        return (0, order.index(value), "") if value in order else (1, 0, str(value))

    ordered = {name: sorted(values[name], key=functools.partial(rank, name)) for name in values}
    return fixed_space(problem, ordered, [s.params for s in landscape.settings])


@dataclass(frozen=True)
class Evaluation:
    """One replayed evaluation."""

    index: int
    """1-based: the how-manyth template setting the search evaluated (the seed kernel is 0)."""
    generation: int
    """The generation that proposed it."""
    key: str
    """Its setting_key."""
    outcome: Outcome
    """What the evaluation gave: the verdict and, when ok, the drawn benchmark."""
    value: float | None
    """Its value on the landscape (None: it failed); what scores are computed from."""


@dataclass
class _Stats:
    attempts: int = 0
    compiled: int = 0
    validated: int = 0
    correct: int = 0
    versus_parent: int = 0
    beats_parent: int = 0
    log_ratio_samples: list[float] = field(default_factory=list)
    log_speedup_samples: list[float] = field(default_factory=list)
    last_position: int = 0


class ReplayLessons:
    """The lessons one replayed search has produced so far, folded as the lessons projection folds a
    search's events (engine/evidence/lessons_projection.py): per change the compile and validation counts,
    the speedups over numpy and over the parent; per template setting its speedups over numpy; failure
    patterns by verdict.

    ``family``: the lessons of replayed searches of other problems of the problem's family on the same target,
    which ran before this one on the same log (leave-one-out transfer). Their rows keep their own problem's
    name, as the projection keeps them, so build_lessons weighs them as the family's evidence."""

    def __init__(self, problem: Problem, target: str, family: Sequence[ReplayLessons] = ()) -> None:
        self.problem = problem
        self.target = target
        self.family = tuple(family)
        self.stats: dict[str, _Stats] = defaultdict(_Stats)
        self.failures: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.settings: dict[str, dict[str, Any]] = {}
        self.changes: dict[str, list[str]] = {}
        # The family's searches came first on the log: this search's positions follow theirs.
        self.position: int = sum(member.position for member in self.family)
        self.remeasures = 0
        """Re-measurements folded (``remeasured``), each one position too."""

    def add(self, candidate: Candidate, parent: Candidate | None, outcome: CandidateOutcome, draw: Outcome) -> None:
        """Fold one candidate's outcome: ``parent`` is the incumbent it was timed against (None: the seed)."""
        changes = changes_of(candidate.model_dump(include={"params", "tags"}))
        self.changes[candidate.candidate_id] = changes
        introduced = (
            changes if parent is None else sorted(set(changes) - set(self.changes.get(parent.candidate_id, [])))
        )
        self.position += 1
        rows = [self.stats[c] for c in [*changes, ALL]]
        for row in rows:
            row.last_position = self.position
            row.attempts += 1
            row.compiled += draw.failed_step != "compile"
        if draw.failed_step == "compile":
            self._failure([*changes, ALL], "compile", draw.verdict, draw.message)
            return
        for row in rows:
            row.validated += 1
            row.correct += draw.failed_step != "validate"
        if draw.failed_step is not None:
            kind = "validation" if draw.failed_step == "validate" else "benchmark"
            self._failure([*changes, ALL], kind, draw.verdict, draw.message)
            return
        self._reading(candidate, outcome, rows)
        if parent is None or outcome.ratio is None:
            return
        for change in [*introduced, ALL]:
            row = self.stats[change]
            row.versus_parent += 1
            row.beats_parent += (outcome.ratio_ci_low or 0.0) > 1.0
            row.log_ratio_samples = [*row.log_ratio_samples, math.log(outcome.ratio)][-LESSON_SAMPLES:]

    def remeasured(self, candidate: Candidate, outcome: CandidateOutcome) -> None:
        """Fold an ok re-measurement of a candidate already added: another reading of its setting."""
        self.position += 1
        self.remeasures += 1
        self._reading(candidate, outcome, [self.stats[c] for c in [*self.changes[candidate.candidate_id], ALL]])

    def _reading(self, candidate: Candidate, outcome: CandidateOutcome, rows: list[_Stats]) -> None:
        """One ok reading into the changes' and the setting's speedup samples, as the projection folds it."""
        assert outcome.speedup is not None
        log_speedup = math.log(outcome.speedup)
        for row in rows:
            row.log_speedup_samples = [*row.log_speedup_samples, log_speedup][-LESSON_SAMPLES:]
        if candidate.params:
            setting = self.settings.setdefault(
                candidate.candidate_id,
                {
                    "problem": self.problem.name,
                    "candidate_id": candidate.candidate_id,
                    "params": dict(candidate.params),
                    "log_speedup_samples": [],
                    "log_halfwidth_samples": [],
                    # A landscape is recorded by today's judge, and replayed as on the machine that recorded it.
                    "method": measurement_method(self.target),
                    "machine": REPLAYED_MACHINE,
                },
            )
            setting["log_speedup_samples"] = [*setting["log_speedup_samples"], log_speedup][-LESSON_SAMPLES:]
            width = reading_halfwidth(outcome.speedup_ci_low, outcome.speedup_ci_high, False)
            setting["log_halfwidth_samples"] = [*setting["log_halfwidth_samples"], width][-LESSON_SAMPLES:]
            setting["last_position"] = self.position

    def _failure(self, changes: Iterable[str], kind: str, pattern: str, example: str) -> None:
        for change in changes:
            row = self.failures.setdefault(
                (change, kind, pattern),
                {"problem": self.problem.name, "change": change, "kind": kind, "pattern": pattern, "count": 0},
            )
            row["count"] += 1
            row["example"] = example
            row["last_position"] = self.position

    def lessons(self) -> dict[str, Any]:
        """The Lessons dump a ProposalContext carries, as lessons_for would return them now."""
        members = [*self.family, self]
        stats = [
            _Row({"problem": member.problem.name, "change": change, **dataclasses.asdict(row)})
            for member in members
            for change, row in sorted(member.stats.items())
        ]
        lessons = build_lessons(
            self.problem.name,
            self.problem.family,
            self.target,
            self.position,
            stats,
            [row for member in members for row in member.failures.values()],
            set(self.problem.template_params) or None,
            [row for member in members for row in member.settings.values()],
        )
        return lessons.model_dump(mode="json")


def _ratio(candidate: Outcome, incumbent: Outcome) -> tuple[float, float, float]:
    """The candidate's speedup over the incumbent from two independent draws, with an interval."""
    assert candidate.speedup and incumbent.speedup
    centre = math.log(candidate.speedup) - math.log(incumbent.speedup)
    half = math.hypot(_half_width(candidate), _half_width(incumbent))
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def _half_width(outcome: Outcome) -> float:
    low = outcome.ci_low or outcome.speedup or 1.0
    high = outcome.ci_high or outcome.speedup or 1.0
    return (math.log(high) - math.log(low)) / 2


def _candidate_outcome(candidate: Candidate, draw: Outcome, incumbent: Outcome | None) -> CandidateOutcome:
    if draw.verdict != "ok":
        return CandidateOutcome(candidate_id=candidate.candidate_id, label=candidate.label, verdict=draw.verdict)
    ratio, low, high = (
        _ratio(draw, incumbent)
        if incumbent is not None and incumbent.speedup
        else (
            draw.speedup or 0.0,
            draw.ci_low or 0.0,
            draw.ci_high or 0.0,
        )
    )
    return CandidateOutcome(
        candidate_id=candidate.candidate_id,
        label=candidate.label,
        verdict="ok",
        ratio=ratio,
        ratio_ci_low=low,
        ratio_ci_high=high,
        speedup=draw.speedup,
        speedup_ci_low=draw.ci_low,
        speedup_ci_high=draw.ci_high,
    )


_Evaluated = tuple[Candidate, Setting, CandidateOutcome, Outcome]


def _remeasure_shaky(
    outcomes: list[_Evaluated],
    incumbent_setting: Setting,
    policy: PromotionPolicy,
    rng: np.random.Generator,
    lessons: ReplayLessons,
) -> list[_Evaluated]:
    """The search's re-measurement of a generation's fastest shaky readings before its promotion
    (KernelSearch._remeasure_shaky): each draws another recorded benchmark of its setting against a fresh
    draw of the incumbent's, takes its figures, and is folded as another reading of the setting."""
    again = {o.candidate_id for o in readings_to_remeasure([o for _, _, o, _ in outcomes], policy)}
    result: list[_Evaluated] = []
    for candidate, setting, outcome, draw in outcomes:
        if candidate.candidate_id in again:
            draw = setting.draw(rng)
            outcome = _candidate_outcome(candidate, draw, incumbent_setting.draw(rng)).model_copy(
                update={"remeasured": True}
            )
            lessons.remeasured(candidate, outcome)
        result.append((candidate, setting, outcome, draw))
    return result


def replay_search(
    proposer: Proposer,
    problem: Problem,
    landscape: Landscape,
    *,
    evaluations: int,
    seed: int,
    per_generation: int = DEFAULT_PER_GENERATION,
    policy: PromotionPolicy | None = None,
    lessons: ReplayLessons | None = None,
) -> list[Evaluation]:
    """One search by ``proposer`` on ``landscape`` until ``evaluations`` template settings were evaluated
    (or the proposer has nothing left); its evaluations in order. ``seed`` is the search's seed (what the
    proposer sees) and also seeds the draws of recorded benchmarks. ``lessons`` are what earlier searches
    on the same log left (a warm search, as a later search of the problem sees them); they go on folding
    this search's outcomes, so a third search can continue from them."""
    space = recorded_space(problem, landscape)
    policy = policy or PromotionPolicy()
    by_key = {s.key: s for s in landscape.settings}
    rng = np.random.default_rng([seed, 7])
    lessons = lessons if lessons is not None else ReplayLessons(space, landscape.target)
    seed_candidate = Candidate.create(problem.seed_source(), None, label="seed", proposer="seed", tags=["seed"])
    seed_setting = landscape.seed or Setting("seed", {}, seed_candidate.candidate_id, "ok", ())
    incumbent, incumbent_setting = seed_candidate, seed_setting
    incumbent_draw: Outcome | None = None
    if seed_setting.ok:
        first = seed_setting.draw(rng)
        incumbent_draw = first
        lessons.add(seed_candidate, None, _candidate_outcome(seed_candidate, first, None), first)
    seen = [seed_candidate.candidate_id]
    evaluated: list[Evaluation] = []
    generation = 0
    while len(evaluated) < evaluations:
        generation += 1
        context = ProposalContext(
            search_id=f"replay-{landscape.problem}-{seed}",
            problem=problem.name,
            target=landscape.target,
            machine=REPLAYED_MACHINE,
            generation=generation,
            count=min(per_generation, evaluations - len(evaluated)),
            seed=seed,
            incumbent=incumbent,
            seen=list(seen),
            lessons=lessons.lessons(),
            # What the workflow passes: the incumbent's speedup over numpy as measured when it was promoted.
            incumbent_evidence=(
                {"speedup": incumbent_draw.speedup, "ci_low": incumbent_draw.ci_low, "ci_high": incumbent_draw.ci_high}
                if incumbent_draw is not None and incumbent_draw.speedup
                else {}
            ),
        )
        picks = proposer.propose(space, context)
        if not picks:
            break
        outcomes: list[_Evaluated] = []
        for candidate in picks[: context.count]:
            setting = by_key.get(setting_key(candidate.params))
            if setting is None:
                raise ValueError(
                    f"{proposer.name} proposed {candidate.label!r}, which the landscape of {landscape.problem} did "
                    "not record; a replayed proposer must stay in the template space it was given"
                )
            draw = setting.draw(rng)
            reference = incumbent_setting.draw(rng) if incumbent_setting.ok else None
            outcome = _candidate_outcome(candidate, draw, reference)
            lessons.add(candidate, incumbent, outcome, draw)
            outcomes.append((candidate, setting, outcome, draw))
            seen.append(candidate.candidate_id)
            evaluated.append(Evaluation(len(evaluated) + 1, generation, setting.key, draw, setting.value))
        if incumbent_setting.ok:
            outcomes = _remeasure_shaky(outcomes, incumbent_setting, policy, rng, lessons)
        promoted = choose_promotion([o for _, _, o, _ in outcomes], policy)
        if promoted is not None:
            incumbent, incumbent_setting, _, incumbent_draw = next(t for t in outcomes if t[2] is promoted)
    return evaluated
