"""Statistics of paired timings: per-shape ratios, their weighted geometric mean, bootstrap intervals.

A benchmark times the candidate and a reference point in rounds (one call each, back to back, order
rotated), so round ``i`` gives a pair ``(reference_ns[i], candidate_ns[i])`` measured under the same
machine conditions. The ratio of a shape is the median over rounds of ``reference_ns / candidate_ns``:
pairing cancels slow drift (another process starting, frequency changes) and the median ignores the
rounds a noisy neighbour interrupted.

Intervals come from a moving-block bootstrap over rounds: a resample takes blocks of consecutive rounds,
so noise that lasts several rounds (and therefore hits neighbouring pairs alike) is not mistaken for
independent evidence. The speedup's interval resamples every shape jointly in each replicate, then takes
the weighted geometric mean, so it accounts for the noise of every shape at once.

Resampling rounds only sees noise *within* one run. Repeated A/A runs on a shared machine vary more than
that from run to run (which other work shares the memory bus during a shape's window, where pages and code
landed), so each bootstrap replicate also draws a run-level effect from a normal distribution with
standard deviation ``noise_floor``: one per shape for the shape's own interval, and ONE shared by every
shape for the speedup's. Why shared: each contender's worker process serves every shape of a benchmark,
so an effect of the process (where its pages and code landed, which core's cache it warmed) shifts all
shapes alike and does not average down across them; drawing shape effects independently shrank the
floor's share of the speedup's interval by sqrt(shapes) and let a 3% process-level A/A offset through
three times in a row on a CI machine. Benchmarks use the floor measured on their machine with A/A runs
(engine.harness.noise); ``DEFAULT_NOISE_FLOOR`` is what the 2-core development machine once needed when
it was busy (1-3% per shape): without a floor, A/A intervals covered 1.0 in only 40-75% of runs there;
with 2.5%, in 92% of 48 (median half-width 2.8%), the misses being a heavy tail of 4-12% run-level swings
that no normal floor within a 3% half-width budget covers (bench/evaluation.py measures coverage and width).

Intervals are percentile intervals of the replicates at ``confidence`` (0.95 unless the caller says: the
search passes its promotion policy's level).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
# Run-to-run standard deviation of a shape's log ratio beyond what resampling rounds shows, for callers
# without a measured one (see above; benchmarks measure theirs, engine.harness.noise).
DEFAULT_NOISE_FLOOR = 0.025


@dataclass(frozen=True)
class RatioEstimate:
    """A ratio (reference time / candidate time: >1 means the candidate is faster) and its interval."""

    ratio: float
    ci_low: float
    ci_high: float


def block_length(n: int) -> int:
    """Block length of the moving-block bootstrap for ``n`` rounds (about n^(1/3), the usual rate)."""
    return max(1, round(n ** (1 / 3)))


def block_bootstrap_indices(n: int, resamples: int, rng: np.random.Generator, block: int | None = None) -> np.ndarray:
    """``resamples`` × ``n`` round indices: random starting points, each followed by a run of ``block``
    consecutive rounds (wrapping around), until ``n`` indices are drawn."""
    length = block if block is not None else block_length(n)
    blocks = -(-n // length)
    starts = rng.integers(0, n, size=(resamples, blocks))
    indices = (starts[:, :, None] + np.arange(length)[None, None, :]) % n
    return indices.reshape(resamples, blocks * length)[:, :n]


def paired_log_ratios(reference_ns: npt.ArrayLike, candidate_ns: npt.ArrayLike) -> np.ndarray:
    """log(reference / candidate) per round."""
    reference = np.asarray(reference_ns, dtype=np.float64)
    candidate = np.asarray(candidate_ns, dtype=np.float64)
    if reference.shape != candidate.shape or reference.size == 0:
        raise ValueError(f"need paired, non-empty samples; got {reference.shape} and {candidate.shape}")
    return np.log(np.maximum(reference, 1.0)) - np.log(np.maximum(candidate, 1.0))


def weighted_geomean(values: Sequence[float], weights: Sequence[float]) -> float:
    """exp(sum(w·log v) / sum(w))."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    return float(np.exp(np.sum(w * np.log(v)) / np.sum(w)))


def speedup_with_intervals(
    pairs: Sequence[tuple[npt.ArrayLike, npt.ArrayLike]],
    weights: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    block: int | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    noise_floor: float = DEFAULT_NOISE_FLOOR,
) -> tuple[RatioEstimate, list[RatioEstimate]]:
    """The weighted geometric mean of per-shape paired median ratios and each shape's ratio, all with
    bootstrap intervals at ``confidence``. ``pairs[s]`` is ``(reference_ns, candidate_ns)`` of shape ``s``,
    by round; ``noise_floor`` is the run-level standard deviation of a shape's log ratio (see the module
    docstring)."""
    if len(pairs) != len(weights) or not pairs:
        raise ValueError(f"need one weight per shape; got {len(pairs)} shapes and {len(weights)} weights")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0.5 and 1, e.g. 0.95; got {confidence!r}")
    if not noise_floor >= 0:
        raise ValueError(f"noise_floor is a standard deviation and must be 0 or more, e.g. 0.01; got {noise_floor!r}")
    rng = np.random.default_rng(seed)
    tail = (1 - confidence) / 2 * 100
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    per_shape = []
    # The run-level effect common to all shapes (see the module docstring), drawn once per replicate.
    replicate_logs = rng.normal(0.0, noise_floor, resamples)
    point_logs = []
    for (reference, candidate), weight in zip(pairs, w, strict=True):
        logs = paired_log_ratios(reference, candidate)
        point = float(np.median(logs))
        indices = block_bootstrap_indices(logs.size, resamples, rng, block)
        within = np.median(logs[indices], axis=1)
        low, high = np.percentile(within + rng.normal(0.0, noise_floor, resamples), [tail, 100 - tail])
        per_shape.append(RatioEstimate(float(np.exp(point)), float(np.exp(low)), float(np.exp(high))))
        replicate_logs += weight * within
        point_logs.append(point)
    total = float(np.exp(np.dot(w, point_logs)))
    low, high = np.percentile(replicate_logs, [tail, 100 - tail])
    return RatioEstimate(total, float(np.exp(low)), float(np.exp(high))), per_shape
