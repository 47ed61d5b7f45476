"""The random proposer: draws parameter settings of the problem's template uniformly, without repeats."""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import numpy as np

from engine.problems import Problem
from engine.proposers.base import ProposalContext
from engine.search.candidates import Candidate

T = TypeVar("T")


def template_space(problem: Problem) -> list[dict[str, Any]]:
    """Every parameter setting the template allows, in a stable order."""
    return [dict(s) for s in _allowed_settings(problem)]


SPACES_KEPT = 32
"""Template spaces (and what the proposers derive from them) kept per process: one per problem and backend
searched lately."""


class SpaceCache(Generic[T]):
    """What is derived from a template space, kept by a key that starts with its Problem.space_identity(): the
    SPACES_KEPT most recently used."""

    def __init__(self) -> None:
        self._kept: collections.OrderedDict[Hashable, T] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, derive: Callable[[], T]) -> T:
        """The value kept under ``key``, derived (outside the lock: it may take a second) when none is."""
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        value = derive()
        with self._lock:
            self._kept[key] = value
            while len(self._kept) > SPACES_KEPT:
                self._kept.popitem(last=False)
        return value


_SETTINGS: SpaceCache[tuple[dict[str, Any], ...]] = SpaceCache()


def _allowed_settings(problem: Problem) -> tuple[dict[str, Any], ...]:
    # A widened space has thousands of settings in a product of tens of thousands: enumerated once per problem
    # definition, not at every proposal.
    return _SETTINGS.get(problem.space_identity(), lambda: _enumerate(problem))


def _enumerate(problem: Problem) -> tuple[dict[str, Any], ...]:
    names = sorted(problem.template_params)
    settings = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(problem.template_params[n] for n in names))
    ]
    return tuple(s for s, ok in zip(settings, problem.allowed(settings), strict=True) if ok)


def template_candidate(problem: Problem, params: dict[str, Any], flags: list[str] | None, **lineage: Any) -> Candidate:
    """The candidate a template setting renders to, tagged with its parameter values."""
    label = "template " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    tags = [f"{k}={v}" for k, v in sorted(params.items())]
    return Candidate.create(problem.render_template(params), flags, label=label, params=params, tags=tags, **lineage)


class RandomTemplateProposer:
    """Uniform random sampling of the template space; the control against which smarter agents are judged."""

    name = "random"

    def propose(self, problem: Problem, context: ProposalContext) -> list[Candidate]:
        seen = set(context.seen)
        fresh = [
            c
            for c in (
                template_candidate(
                    problem,
                    params,
                    context.flags,
                    proposer=self.name,
                    parent_id=context.incumbent.candidate_id if context.incumbent else None,
                    rationale="uniform draw from the template's parameter space",
                )
                for params in template_space(problem)
            )
            if c.candidate_id not in seen
        ]
        # Randomness derives from (seed, generation) so a retried proposal proposes the same candidates.
        rng = np.random.default_rng([context.seed, context.generation])
        picks = rng.permutation(len(fresh))[: context.count]
        return [fresh[int(i)] for i in sorted(picks)]
