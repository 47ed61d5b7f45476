"""The search proposer: no repeats, deterministic per seed, steered by lessons (no database needed).

The tests search fixed template spaces (the softmax and rmsnorm templates' knobs as they were when the tests
were written), so a problem's growing template space changes neither what they check nor how long they take.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proposer_fixtures import prior

from engine.evidence.lessons import SettingEvidence
from engine.evidence.lessons_projection import BUSY_READING_HALFWIDTH
from engine.problems import load_problem
from engine.proposers import ProposalContext, proposer_for
from engine.proposers import search as search_proposer
from engine.proposers.random_template import template_candidate, template_space
from engine.proposers.search import (
    COVERING_SETTINGS,
    EXPLORE_MAIN_FACTOR,
    EXPLORE_PAIR_FACTOR,
    EXPLORER_MODEL_SD,
    SearchProposer,
    model_of,
)
from engine.proposers.surrogate import MODEL_SD, Features
from engine.replay.simulation import RecordedSpace, fixed_space
from engine.search.candidates import Candidate

SPACES: dict[str, dict[str, list[Any]]] = {
    "softmax": {"ONLINE": [0, 1], "UNROLL": [1, 2, 4, 8], "SIMD": [0, 1], "FUSED": [0, 1], "NT": [0, 1]},
    "rmsnorm": {
        "ACC": [1, 4, 8, 16],
        "ROWS": [1, 2, 4],
        "SIMD": [0, 1],
        "FUSED": [0, 1],
        "VEC": [256, 512],
        "NT": [0, 1],
    },
}


def problem_of(name: str) -> RecordedSpace:
    """The built-in problem with the fixed template space of SPACES."""
    return fixed_space(load_problem(name), SPACES[name])


def context(generation: int = 1, seed: int = 0, **fields: Any) -> ProposalContext:
    return ProposalContext(
        search_id="s", problem="softmax", target="cpu-test", generation=generation, count=4, seed=seed, **fields
    )


def test_registered_as_search() -> None:
    assert isinstance(proposer_for("search"), SearchProposer)


def test_never_proposes_a_candidate_twice_and_exhausts_the_space() -> None:
    problem = problem_of("softmax")
    proposer = SearchProposer()
    seen: list[str] = []
    incumbent: Candidate | None = None
    for generation in range(1, 20):
        picks = proposer.propose(problem, context(generation, incumbent=incumbent, seen=list(seen)))
        if not picks:
            break
        assert len({c.candidate_id for c in picks}) == len(picks)
        assert not {c.candidate_id for c in picks} & set(seen)
        assert all(c.proposer == "search" and c.rationale for c in picks)
        seen += [c.candidate_id for c in picks]
        assert all(c.parent_id == (incumbent.candidate_id if incumbent else None) for c in picks)
        incumbent = picks[0]
    assert len(seen) == len(set(seen)) == len(template_space(problem))


def test_deterministic_per_seed_and_generation() -> None:
    problem = problem_of("rmsnorm")
    proposer = SearchProposer()
    ids = [[c.candidate_id for c in proposer.propose(problem, context(2, seed))] for seed in (1, 1, 2)]
    assert ids[0] == ids[1]
    assert ids[0] != ids[2]
    next_generation = [c.candidate_id for c in proposer.propose(problem, context(3, 1))]
    assert next_generation != ids[0]


def test_exploits_the_incumbents_neighbourhood() -> None:
    problem = problem_of("rmsnorm")
    params = {"ACC": 4, "ROWS": 2, "SIMD": 0, "FUSED": 1, "VEC": 256, "NT": 0}
    incumbent = template_candidate(problem, params, None, proposer="search")
    picks = SearchProposer().propose(problem, context(1, 3, incumbent=incumbent))
    distances = [sum(p.params[k] != v for k, v in params.items()) for p in picks]
    # Every other pick after the first changes one or two of the incumbent's parameters.
    assert all(1 <= d <= 2 for d in distances[1::2])
    assert all(p.parent_id == incumbent.candidate_id for p in picks)
    assert "exploit" in picks[1].rationale


def test_where_nothing_is_one_or_two_changes_away_it_exploits_the_nearest_settings_the_space_holds(
    monkeypatch: Any,
) -> None:
    # A sparse space (a replay's sample, a template whose rules thin it out): no setting within two changes of the
    # incumbent, a few at three, the rest four to six away.
    monkeypatch.setattr(search_proposer, "NEIGHBOURS_AT_LEAST", 4)
    params = {"ACC": 4, "ROWS": 2, "SIMD": 0, "FUSED": 1, "VEC": 256, "NT": 0}
    full = template_space(problem_of("rmsnorm"))

    def distance(setting: dict[str, Any]) -> int:
        return sum(setting[k] != v for k, v in params.items())

    by_distance = Counter(distance(s) for s in full)
    nearest = [s for s in full if distance(s) == 3][:5]
    allowed = [params, *nearest, *(s for s in full if distance(s) >= 4)]
    problem = fixed_space(load_problem("rmsnorm"), SPACES["rmsnorm"], allowed)
    incumbent = template_candidate(problem, params, None, proposer="search")
    assert by_distance[4] + by_distance[5] + by_distance[6] > 50  # far settings outnumber the near ones
    for seed in range(5):
        picks = SearchProposer().propose(problem, context(1, seed, incumbent=incumbent))
        # The first exploiting pick is one of the five three changes away, not a far one. (The next may look
        # anywhere: none of the five tries the values left untried, see the covering phase.)
        assert distance(picks[1].params) == 3, [p.rationale for p in picks]
        assert picks[1].rationale.startswith("exploit: the incumbent with"), picks[1].rationale


def measured(problem: str, speed: Callable[[dict[str, Any]], float], every: int = 1) -> list[dict[str, Any]]:
    """Lessons.settings rows for every ``every``-th setting of the problem's space, measured at ``speed``."""
    space = template_space(problem_of(problem))
    return [
        SettingEvidence(
            problem=problem,
            candidate_id=f"{problem}-{i}",
            params=params,
            n=1,
            log_speedup_mean=math.log(speed(params)),
            log_speedup_var=0.0,
        ).model_dump(mode="json")
        for i, params in enumerate(space)
        if i % every == 0
    ]


def rmsnorm_speed(params: dict[str, Any]) -> float:
    """A made-up rmsnorm landscape with an interaction: streaming stores pay only in the two-pass variant."""
    speed = 2.0 * (1.1 if params["ACC"] > 1 else 1.0)
    if params["NT"] == 1:
        speed *= 1.6 if params["FUSED"] == 0 else 0.7
    return speed


def test_lessons_change_its_choices() -> None:
    problem = problem_of("softmax")
    proposer = SearchProposer()
    # A third of the settings measured (every UNROLL among them), the fastest of them with UNROLL=8.
    lessons = {"settings": measured("softmax", lambda p: 3.0 if p["UNROLL"] == 8 else 1.5, every=3)}
    without: Counter[int] = Counter()
    informed: Counter[int] = Counter()
    for seed in range(30):
        for c in proposer.propose(problem, context(1, seed)):
            without[c.params["UNROLL"]] += 1
        for c in proposer.propose(problem, context(1, seed, lessons=lessons)):
            informed[c.params["UNROLL"]] += 1
    total = sum(without.values())
    # Without lessons UNROLL=8 is one of four values; with lessons saying it is great, it dominates.
    assert without[8] < total / 2
    assert informed[8] >= 2 * without[8]
    assert informed[8] >= total / 2


def test_the_first_pick_exploits_an_interaction_it_has_only_seen_in_parts() -> None:
    problem = problem_of("rmsnorm")
    # A third of the space measured; the model must find that NT=1 pays with FUSED=0 and hurts with FUSED=1,
    # which the average effect of NT=1 alone (about 1.15x) does not say.
    lessons = {"settings": measured("rmsnorm", rmsnorm_speed, every=3)}
    firsts = [SearchProposer().propose(problem, context(1, seed, lessons=lessons))[0] for seed in range(10)]
    assert all(c.params["NT"] == 1 and c.params["FUSED"] == 0 for c in firsts)
    assert all("posterior mean" in c.rationale for c in firsts)


def test_one_evaluation_in_four_exploits_whatever_the_generation_size() -> None:
    problem = problem_of("rmsnorm")
    lessons = {"settings": measured("rmsnorm", rmsnorm_speed, every=3)}
    for count in (1, 2, 4, 8):
        seen = ["seed"]
        exploits: list[bool] = []
        for generation in range(1, 9):
            ctx = context(generation, 0, seen=list(seen), lessons=lessons).model_copy(update={"count": count})
            picks = SearchProposer().propose(problem, ctx)
            assert len(picks) == count
            exploits += ["posterior mean" in c.rationale for c in picks]
            # The exploiting picks come first in their generation.
            assert exploits[-count:] == sorted(exploits[-count:], reverse=True)
            seen += [c.candidate_id for c in picks]
        # One generation of one candidate after another must not follow the fitted model alone: a search that
        # only exploits stays on its first good guess.
        assert sum(exploits) == len(exploits) // 4, (count, exploits)


def test_transfer_from_a_family_member_through_shared_parameter_names() -> None:
    rmsnorm = problem_of("rmsnorm")
    # Only softmax was measured: there, too, streaming stores pay only in the two-pass variant.
    softmax = measured("softmax", lambda p: 2.0 * ((1.6 if p["FUSED"] == 0 else 0.7) if p.get("NT") else 1.0))
    lessons = {"settings": softmax}
    informed = Counter(
        (c.params["FUSED"], c.params["NT"])
        for seed in range(20)
        for c in SearchProposer().propose(rmsnorm, context(1, seed, lessons=lessons))[:1]
    )
    blind = Counter(
        (c.params["FUSED"], c.params["NT"])
        for seed in range(20)
        for c in SearchProposer().propose(rmsnorm, context(1, seed))[:1]
    )
    assert informed[(0, 1)] == 20
    assert blind[(0, 1)] < 15
    picks = SearchProposer().propose(rmsnorm, context(1, 0, lessons=lessons))
    assert "priors from softmax" in picks[0].rationale


def test_dead_ends_are_avoided_while_anything_else_is_left() -> None:
    problem = problem_of("softmax")
    dead = prior("SIMD=1", 0.5, 5, correct=0.0) | {"dead_end": True, "correct_beta": 6.0}
    lessons = {"priors": {"SIMD=1": dead}}
    picks = [c for seed in range(10) for c in SearchProposer().propose(problem, context(1, seed, lessons=lessons))]
    assert picks and all(c.params["SIMD"] == 0 for c in picks)


def test_a_cold_search_covers_every_value_of_every_parameter_first() -> None:
    problem = problem_of("rmsnorm")  # 192 settings
    values = {f"{k}={v}" for k, vs in SPACES["rmsnorm"].items() for v in vs}
    for seed in range(5):
        picks = SearchProposer().propose(problem, context(1, seed))
        tried = {f"{k}={v}" for c in picks for k, v in c.params.items()}
        # Four picks, at most four values per parameter: the first generation tries every one of them.
        assert tried == values
        assert any("tries untried" in c.rationale for c in picks)


def test_every_seed_gives_a_search_of_its_own() -> None:
    problem = problem_of("rmsnorm")
    firsts = {tuple(c.candidate_id for c in SearchProposer().propose(problem, context(1, seed))) for seed in range(8)}
    assert len(firsts) == 8


def test_one_slow_reading_of_a_combination_does_not_rule_out_a_value() -> None:
    problem = problem_of("rmsnorm")
    # Streaming stores (NT=1) pay 1.6x in the two-pass variant (FUSED=0) and cost in the fused one. The
    # search has measured a third of the NT=0 settings and one NT=1 setting, a fused one that came back slow.
    nt0 = [s for s in measured("rmsnorm", rmsnorm_speed, every=3) if s["params"]["NT"] == 0]
    slow = {"ACC": 4, "ROWS": 1, "SIMD": 0, "FUSED": 1, "VEC": 256, "NT": 1}
    one = SettingEvidence(
        problem="rmsnorm",
        candidate_id="rmsnorm-slow",
        params=slow,
        n=1,
        log_speedup_mean=math.log(rmsnorm_speed(slow)),
        log_speedup_var=0.0,
    ).model_dump(mode="json")
    lessons = {"settings": [*nt0, one]}
    incumbent = template_candidate(problem, {**slow, "NT": 0}, None, proposer="search")
    tried = 0
    for seed in range(10):
        picks = SearchProposer().propose(problem, context(2, seed, lessons=lessons, incumbent=incumbent))
        # An upper-bound pick goes back to NT=1 in the combination that was not tried.
        tried += any(c.params["NT"] == 1 and c.params["FUSED"] == 0 for c in picks[2:])
    assert tried >= 8


def test_a_search_its_family_informs_follows_the_family_until_it_has_evidence_of_its_own(monkeypatch: Any) -> None:
    rmsnorm = problem_of("rmsnorm")
    softmax = measured("softmax", lambda p: 2.0 * ((1.6 if p["FUSED"] == 0 else 0.7) if p.get("NT") else 1.0))
    own = measured("rmsnorm", rmsnorm_speed, every=5)[:COVERING_SETTINGS]

    def picks(settings: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            c.params
            for seed in range(20)
            for c in SearchProposer().propose(rmsnorm, context(1, seed, lessons={"settings": settings}))
        ]

    def family_favourites(chosen: list[dict[str, Any]]) -> int:
        return sum((p["FUSED"], p["NT"]) == (0, 1) for p in chosen)

    transfer, informed = picks(softmax), picks(softmax + own)
    monkeypatch.setattr(search_proposer, "TRANSFER_UCB_KAPPA", search_proposer.UCB_KAPPA)
    wide, informed_wide = picks(softmax), picks(softmax + own)
    # Fewer spreads on the upper bounds: more of the first picks try what the family found fast.
    assert family_favourites(transfer) > family_favourites(wide) + 10
    # With COVERING_SETTINGS measured settings of its own, the search explores as any other.
    assert informed == informed_wide


def test_only_a_cold_search_without_transfer_widens_the_explorers_main_effects(monkeypatch: Any) -> None:
    rmsnorm = problem_of("rmsnorm")
    nt = Features(SPACES["rmsnorm"]).index["NT=1"]
    own = measured("rmsnorm", rmsnorm_speed, every=5)
    softmax = measured("softmax", lambda p: 2.0 * (1.6 if p["NT"] else 1.0))
    cases = {
        "cold": [],
        "a few settings": own[: COVERING_SETTINGS - 1],
        "covered": own[:COVERING_SETTINGS],
        "transfer": softmax,
    }

    def spreads() -> dict[str, float]:
        return {
            name: float(model_of(rmsnorm, {"settings": settings}, EXPLORE_PAIR_FACTOR)[1].covariance()[nt, nt])
            for name, settings in cases.items()
        }

    covering = spreads()
    monkeypatch.setattr(search_proposer, "EXPLORE_MAIN_FACTOR", 1.0)
    fitted = spreads()
    # Nothing measured: the prior alone, twice as wide.
    assert math.isclose(covering["cold"], EXPLORE_MAIN_FACTOR**2 * fitted["cold"], rel_tol=1e-6)
    assert covering["a few settings"] > 1.5 * fitted["a few settings"]
    # Once the problem has its own evidence, or its family's, the explorer's main effects are the fitted ones.
    assert covering["covered"] == fitted["covered"]
    assert covering["transfer"] == fitted["transfer"]


def test_a_wide_or_busy_reading_steers_the_model_less() -> None:
    problem = problem_of("rmsnorm")
    settings = measured("rmsnorm", rmsnorm_speed, every=4)
    spike = dict(settings[0]) | {"log_speedup_mean": settings[0]["log_speedup_mean"] + math.log(2.0)}
    quiet = dict(spike) | {"log_interval_halfwidth": 0.02}
    busy = dict(spike) | {"log_interval_halfwidth": BUSY_READING_HALFWIDTH}
    believed = {}
    for name, reading in [("quiet", quiet), ("busy", busy)]:
        posterior, _, _ = model_of(problem, {"settings": [reading, *settings[1:]]})
        row = posterior.features.matrix([settings[0]["params"]])[0]
        believed[name] = float(row @ posterior.mean)
    truth = settings[0]["log_speedup_mean"]
    # A reading twice as fast as the setting runs pulls the model up; a busy one far less than a quiet one.
    assert believed["quiet"] - truth > 2 * (believed["busy"] - truth) > 0


def test_the_explorer_counts_each_reading_for_less_than_the_fit_does() -> None:
    problem = problem_of("rmsnorm")
    lessons = {"settings": measured("rmsnorm", rmsnorm_speed, every=6)}
    posterior, explorer, _ = model_of(problem, lessons, EXPLORE_PAIR_FACTOR)
    # What the model leaves out may move a reading by EXPLORER_MODEL_SD under the explorer: a value read slow
    # in a few combinations stays worth a try. The fitted model (exploitation, rationales) keeps MODEL_SD.
    assert posterior.scales.model_sd == MODEL_SD < EXPLORER_MODEL_SD == explorer.scales.model_sd
    nt = posterior.features.index["NT=1"]
    assert explorer.covariance()[nt, nt] > posterior.covariance()[nt, nt]


def test_a_template_space_is_enumerated_once_per_definition_and_anew_when_its_folder_changes(tmp_path: Path) -> None:
    # The space (and the proposer's ids and feature rows of it) are kept by the folder's content, not by the loaded
    # Problem: a worker loads the problem afresh for every step. An edit of problem.py must show at once.
    folder = tmp_path / "my_l2norm"
    shutil.copytree(load_problem("l2norm").folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = template_space(load_problem(str(folder)))
    assert before == template_space(load_problem(str(folder)))
    assert any(s["VEC"] == 512 for s in before)
    with (folder / "problem.py").open("a") as module:
        module.write(
            "\n_allows = template_allows\n\n\n"
            "def template_allows(params):\n"
            "    return _allows(params) and params['VEC'] != 512\n"
        )
    edited = load_problem(str(folder))
    after = template_space(edited)
    assert after == [s for s in before if s["VEC"] != 512]
    context = ProposalContext(search_id="s", problem=edited.name, target="cpu", generation=1, count=8, seed=3)
    picks = SearchProposer().propose(edited, context)
    assert len(picks) == 8 and all(c.params["VEC"] != 512 for c in picks)
    # A replay's view of the same folder has a space of its own, whichever is asked first.
    narrow = fixed_space(edited, {"VEC": [256], "ACC": [1, 2]})
    assert template_space(narrow) == [{"ACC": 1, "VEC": 256}, {"ACC": 2, "VEC": 256}]
    assert template_space(edited) == after


def test_a_transfer_search_tries_its_familys_fastest_settings_and_stops_where_they_are_slow() -> None:
    rmsnorm = problem_of("rmsnorm")
    # Softmax measured every setting of its small space: FUSED=0 NT=1 UNROLL=8 ran fastest, FUSED=0 NT=1 next.
    softmax = measured(
        "softmax", lambda p: 2.0 * (1.6 if (p["FUSED"], p["NT"]) == (0, 1) else 1.0) * (1.2 if p["UNROLL"] == 8 else 1)
    )
    fastest = max(softmax, key=lambda s: s["log_speedup_mean"])["params"]
    shared = {k: v for k, v in fastest.items() if k in SPACES["rmsnorm"]}
    for seed in range(10):
        first = SearchProposer().propose(rmsnorm, context(1, seed, lessons={"settings": softmax}, seen=["seed"]))
        # The generation's posterior-mean pick is the setting that shares every value of softmax's fastest.
        assert {k: first[0].params[k] for k in shared} == shared, first[0].params
        assert "softmax's fastest measured settings" in first[0].rationale
    # rmsnorm's own readings: the one setting like the favourite is its slowest (the family misleads here) ...
    liked = next(s for s in template_space(rmsnorm) if all(s[k] == v for k, v in shared.items()))
    own = [
        SettingEvidence(
            problem="rmsnorm",
            candidate_id=f"own-{i}",
            params=params,
            n=1,
            log_speedup_mean=math.log(0.5 if params == liked else 2.0 + i / 10),
            log_speedup_var=0.0,
        ).model_dump(mode="json")
        for i, params in enumerate([liked, *template_space(rmsnorm)[:3]])
    ]
    seen = ["seed", *(s["candidate_id"] for s in own)]
    later = SearchProposer().propose(rmsnorm, context(2, 0, lessons={"settings": softmax + own}, seen=seen))
    assert all("fastest measured settings" not in c.rationale for c in later)
    # ... and where it is the fastest, the search goes on to the next favourite.
    own[0]["log_speedup_mean"] = math.log(4.0)
    followed = SearchProposer().propose(rmsnorm, context(2, 0, lessons={"settings": softmax + own}, seen=seen))
    assert "softmax's fastest measured settings" in followed[0].rationale
