"""What one proposal of an offline proposer costs on each built-in problem's whole template space.

    .venv/bin/python bench/proposal_cost.py [--json] [--problems softmax,bias_gelu] [--proposals 6] [--count 4]
        [--proposer search|gp|random] [--readings 0]

A worker proposes a generation in a propose activity that loads the problem afresh (activities/search.py), so
each proposal here does the same: load the problem, then ask the proposer (``--proposer``, engine.proposers
proposer_for; by default the one a search gets, engine/search/spec.py) for ``--count`` candidates, a generation
further each time. With ``--readings 0`` the search has no evidence yet (the model fitted to nothing, every
setting of the space fresh); with ``--readings N`` it has N measured settings of the problem, drawn from the space
with speeds drawn at random (seeded), which is where a model's fit costs: a Gaussian process grows with the cube of
its readings. Nothing else runs: no services, no compiler.

Figures, by problem: ``space_settings`` (settings the template allows), ``propose_ms_first`` (the process's first
proposal for the problem: it enumerates the space and renders and hashes every setting's source once),
``propose_ms`` (the median of the others) and ``propose_ms_spread`` (their least and most).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from engine.problems import Problem, builtin_problems, load_problem
from engine.proposers import proposer_for
from engine.proposers.base import ProposalContext
from engine.proposers.random_template import template_candidate, template_space
from engine.search.spec import ProposerKind, ProposerSettings

OFFLINE: tuple[ProposerKind, ...] = ("search", "gp", "random")
"""The proposers this measures (the LLM ones need a model)."""

DEFAULT: ProposerKind = ProposerSettings().kind
"""The proposer a search gets when its spec names none."""


def evidence(problem: Problem, readings: int) -> dict[str, Any]:
    """Lessons of ``readings`` measured settings of ``problem`` (drawn from its space, speeds at random; seeded)."""
    space = template_space(problem)
    rng = np.random.default_rng(0)
    drawn = rng.choice(len(space), min(readings, len(space)), replace=False)
    settings = [
        {
            "problem": problem.name,
            "params": space[int(i)],
            "n": 1,
            "log_speedup_mean": float(rng.normal()),
            "candidate_id": template_candidate(problem, space[int(i)], None, proposer="bench").candidate_id,
        }
        for i in drawn
    ]
    return {"settings": settings}


def proposal_ms(name: str, generation: int, count: int, proposer: ProposerKind = DEFAULT, readings: int = 0) -> float:
    """Milliseconds of loading ``name`` and one proposal of ``count`` candidates at ``generation`` by ``proposer``,
    with ``readings`` measured settings as its evidence (made before the clock starts)."""
    lessons = evidence(load_problem(name), readings) if readings else None
    seen = [s["candidate_id"] for s in lessons["settings"]] if lessons else []
    began = time.perf_counter()
    problem = load_problem(name)
    context = ProposalContext(
        search_id=f"bench-{name}",
        problem=problem.name,
        target="cpu",
        generation=generation,
        count=count,
        seed=generation,
        lessons=lessons,
        seen=seen,
    )
    picks = proposer_for(proposer).propose(problem, context)
    if len(picks) != min(count, len(template_space(problem)) - readings):
        raise SystemExit(f"{name}: proposed {len(picks)} candidates, asked for {count}")
    return (time.perf_counter() - began) * 1000


def measure(
    name: str, proposals: int, count: int, proposer: ProposerKind = DEFAULT, readings: int = 0
) -> dict[str, Any]:
    """One problem's figures (see the module docstring)."""
    times = [proposal_ms(name, generation, count, proposer, readings) for generation in range(1, proposals + 1)]
    later = times[1:] or times
    return {
        "space_settings": len(template_space(load_problem(name))),
        "propose_ms_first": round(times[0], 1),
        "propose_ms": round(statistics.median(later), 1),
        "propose_ms_spread": [round(min(later), 1), round(max(later), 1)],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--problems", default=",".join(builtin_problems("cpu")), help="comma-separated names")
    parser.add_argument("--proposals", type=int, default=6, help="proposals per problem (the first included)")
    parser.add_argument("--count", type=int, default=4, help="candidates per proposal")
    parser.add_argument("--proposer", choices=OFFLINE, default=DEFAULT, help=f"whose proposals (default {DEFAULT})")
    parser.add_argument("--readings", type=int, default=0, help="measured settings the search has (default 0)")
    args = parser.parse_args(argv)
    if args.proposals < 1 or args.count < 1:
        parser.error("--proposals and --count must be at least 1")
    if args.readings < 0:
        parser.error("--readings must be 0 or more")
    names = [name for name in args.problems.split(",") if name]
    known = builtin_problems("cpu")
    for name in names:
        if name not in known:
            parser.error(f"no built-in CPU problem named {name}; choose from {', '.join(known)}")
    if not names:
        parser.error(f"--problems names no problem; choose from {', '.join(known)}")
    figures = {name: measure(name, args.proposals, args.count, args.proposer, args.readings) for name in names}
    if args.json:
        print(json.dumps({"proposer": args.proposer, "readings": args.readings, "problems": figures}, indent=2))
        return
    for name, row in figures.items():
        print(
            f"{name:12s} {row['space_settings']:6d} settings: first proposal {row['propose_ms_first']:7.1f} ms, "
            f"then {row['propose_ms']:6.1f} ms [{row['propose_ms_spread'][0]}, {row['propose_ms_spread'][1]}]"
        )


if __name__ == "__main__":
    main()
