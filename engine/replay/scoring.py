"""Scoring searches on a landscape, after Kernel Tuner's methodology for comparing optimisation strategies:
a strategy's expected best at a budget, placed between random search's expected best (0) and the optimum (1).

With v(s) a setting's value on the landscape (the geometric mean of its recorded speedups over numpy; a
failed setting has none) and a search's evaluations s₁, s₂, …:

    best(b)  = max(v(seed), max{ v(sᵢ) : i <= b, sᵢ correct })   # the seed kernel is where a search starts
    R(b)     = E[best(b)] for b settings drawn uniformly without replacement    # exact, see random_expected_best
    optimum  = max(v(seed), max over the landscape's settings of v)
    score(b) = (mean over searches of best(b) - R(b)) / (optimum - R(b))

A score of 0 is random search's expected best at that budget, 1 the optimum every time; below 0 is worse
than random. When R(b) is the optimum (a budget that covers the space), the score is 1 for a search that
found the optimum too, else below. ``evals_to`` counts the evaluations until a setting within a fraction
of the optimum was evaluated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from statistics import NormalDist

from engine.replay.landscape import Landscape


def best_at(values: Sequence[float | None], budget: int, floor: float) -> float:
    """best(budget) of a search whose evaluations had landscape ``values`` (None: the setting failed)."""
    return max([floor, *(v for v in values[:budget] if v is not None)])


def random_expected_best(landscape: Landscape, budget: int) -> float:
    """R(budget): the exact expectation of best(budget) for ``budget`` settings of the landscape drawn
    uniformly without replacement. With the settings' values w₍₁₎ <= … <= w₍N₎ (a failed setting counts as
    the floor), P(best <= w₍ᵢ₎) = C(i, b) / C(N, b)."""
    floor = landscape.floor
    ordered = sorted(max(floor, v) if v is not None else floor for v in landscape.values())
    n = len(ordered)
    if n == 0:
        return floor
    b = min(budget, n)
    total = math.comb(n, b)
    expected = 0.0
    previous = 0
    for i, value in enumerate(ordered, start=1):
        at_most = math.comb(i, b)
        expected += value * (at_most - previous) / total
        previous = at_most
    return expected


def score(landscape: Landscape, searches: Sequence[Sequence[float | None]], budget: int) -> float | None:
    """score(budget) of ``searches`` (each its evaluations' landscape values, in order); None without any."""
    if not searches:
        return None
    expected = statistics.fmean(best_at(values, budget, landscape.floor) for values in searches)
    scale = _scale(landscape, budget)
    if scale is None:
        return 1.0 if expected >= landscape.optimum * (1 - 1e-12) else 0.0
    baseline, span = scale
    return (expected - baseline) / span


def share_of_optimum(landscape: Landscape, searches: Sequence[Sequence[float | None]], budget: int) -> float | None:
    """E[best(budget)] / optimum: how close the searches' best came to the landscape's optimum on average (1: it
    was always found). The score places the same mean between random search and the optimum, and on a landscape
    whose random best is already within a few percent of the optimum it reads low for a search that ends a few
    percent short; this says how short. None without any search."""
    if not searches or landscape.optimum <= 0:
        return None
    return statistics.fmean(best_at(values, budget, landscape.floor) for values in searches) / landscape.optimum


def _scale(landscape: Landscape, budget: int) -> tuple[float, float] | None:
    """(R(budget), optimum - R(budget)): what a mean best(budget) is placed between; None when the span is
    nil (the budget covers the space)."""
    baseline = random_expected_best(landscape, budget)
    span = landscape.optimum - baseline
    return None if span <= 1e-12 * max(landscape.optimum, 1.0) else (baseline, span)


def score_interval(
    landscape: Landscape, searches: Sequence[Sequence[float | None]], budget: int, confidence: float = 0.95
) -> tuple[float, float] | None:
    """A ``confidence`` interval for score(budget) from the spread of the searches' best(budget) (the normal
    approximation to their mean; R(b) and the optimum are exact): how far the score could move with another
    set of seeds, which a difference between two proposers must exceed to mean anything. A few searches that
    miss the landscape's fast corner pull the mean far down, so the interval is wide where the searches
    disagree. None without two searches or a span to scale by."""
    if len(searches) < 2:
        return None
    scale = _scale(landscape, budget)
    if scale is None:
        return None
    baseline, span = scale
    bests = [best_at(values, budget, landscape.floor) for values in searches]
    half = NormalDist().inv_cdf((1 + confidence) / 2) * statistics.stdev(bests) / math.sqrt(len(bests))
    mean = statistics.fmean(bests)
    return ((mean - half - baseline) / span, (mean + half - baseline) / span)


def evals_to(values: Sequence[float | None], threshold: float) -> int | None:
    """1-based number of evaluations until one reached ``threshold``; None when none did."""
    for index, value in enumerate(values, start=1):
        if value is not None and value >= threshold:
            return index
    return None


def median_evals_to(landscape: Landscape, searches: Sequence[Sequence[float | None]], fraction: float) -> float | None:
    """The median over searches of evals_to(fraction × optimum); a search that never got there counts as
    after all others, so the median is None when more than half never did."""
    threshold = fraction * landscape.optimum
    if landscape.floor >= threshold:
        return 0.0
    counts = [evals_to(values, threshold) for values in searches]
    if not counts:
        return None
    ranked = sorted(math.inf if c is None else float(c) for c in counts)
    middle = statistics.median(ranked)
    return None if math.isinf(middle) else middle
