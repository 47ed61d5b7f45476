"""A surrogate model of how fast a template setting runs, for the search proposer.

ln(speedup over numpy) of a setting is modelled as a level plus one effect per parameter value plus one
effect per pair of parameter values (``FUSED=0&NT=1``), with a Gaussian prior on every effect, fitted to
the measured settings by Bayesian linear regression. Pairs matter because the best kernels are often
combinations whose parts do little alone: rmsnorm's streaming stores (NT=1) pay only in the two-pass
variant (FUSED=0); a sum of main effects averages that away.

The posterior is exact (a Gaussian), so the proposer can draw a whole plausible model at once (Thompson
sampling) or use the posterior mean (exploitation). Prior means may come from another problem of the same
family (transfer): effects of parameter values both templates share, such as ``SIMD=1`` or ``NT=1``.

Transfer can mislead: the same knob may pay on one problem and cost on another (streaming stores help a
memory-bound rmsnorm and slow a compute-bound softmax). So a transferred prior is one of two hypotheses,
weighed against the plain prior by how well each predicted the problem's own measurements (Bayesian model
averaging with the closed-form marginal likelihood): before any own evidence they count half each, and a
few measurements that contradict the family's lessons switch them off.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVEL_PRIOR_SD = 2.0
"""Prior spread of the level, ln(speedup) of a typical setting: anything from 0.1x to 10x numpy."""

MAIN_PRIOR_SD = 0.3
"""Prior spread of one parameter value's effect, in ln(speedup): most values change speed by < 35%."""

PAIR_PRIOR_SD = 0.2
"""Prior spread of one pair's interaction effect: smaller than a main effect, but not negligible."""

MEASUREMENT_SD = 0.08
"""Spread of one measurement of a setting's ln(speedup) between benchmarks (a shared machine swings
by several percent from run to run)."""

MODEL_SD = 0.03
"""What no amount of repeating a measurement removes: effects of three or more parameters together,
which the model leaves out."""


@dataclass(frozen=True)
class Observation:
    """What was measured of one setting: the mean of ``n`` samples of ln(speedup)."""

    params: Mapping[str, Any]
    mean: float
    n: int


def _key(name: str, value: Any) -> str:
    return f"{name}={value}"


class Features:
    """The model's features for one template space: a level, each parameter value, each pair of values."""

    def __init__(self, space: Mapping[str, Sequence[Any]]) -> None:
        names = sorted(space)
        self.names: list[str] = ["level"]
        self.mains: list[str] = [_key(n, v) for n in names for v in space[n]]
        self.pairs: list[str] = [
            f"{_key(a, va)}&{_key(b, vb)}"
            for a, b in itertools.combinations(names, 2)
            for va in space[a]
            for vb in space[b]
        ]
        self.names += self.mains + self.pairs
        self.index = {name: i for i, name in enumerate(self.names)}

    def active(self, params: Mapping[str, Any]) -> list[str]:
        """The features a setting switches on (names of values outside the space are left out)."""
        mains = [_key(n, params[n]) for n in sorted(params)]
        pairs = [f"{a}&{b}" for a, b in itertools.combinations(mains, 2)]
        return ["level", *(f for f in mains + pairs if f in self.index)]

    def matrix(self, settings: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """One 0/1 row per setting."""
        rows = [[self.index[f] for f in self.active(s)] for s in settings]
        x = np.zeros((len(rows), len(self.names)))
        for i, columns in enumerate(rows):
            x[i, columns] = 1.0
        return x

    def vector(self, named: Mapping[str, float]) -> np.ndarray:
        """Values by feature name as a vector over the features (0 for the others; unknown names ignored)."""
        v = np.zeros(len(self.names))
        for name, value in named.items():
            if name in self.index:
                v[self.index[name]] = value
        return v

    def prior_sd(self) -> np.ndarray:
        """Each feature's prior spread: LEVEL_PRIOR_SD, MAIN_PRIOR_SD or PAIR_PRIOR_SD."""
        sd = np.full(len(self.names), PAIR_PRIOR_SD)
        sd[0] = LEVEL_PRIOR_SD
        sd[1 : 1 + len(self.mains)] = MAIN_PRIOR_SD
        return sd


@dataclass(frozen=True)
class Posterior:
    """The effects' posterior: N(mean, precision⁻¹), with ``chol`` the Cholesky factor of the precision."""

    features: Features
    mean: np.ndarray
    chol: np.ndarray
    observations: int

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One draw of every effect together."""
        z = rng.standard_normal(len(self.mean))
        # precision = L Lᵀ, so w = mean + L⁻ᵀ z has covariance precision⁻¹.
        return self.mean + np.linalg.solve(self.chol.T, z)

    def named_mean(self) -> dict[str, float]:
        """Posterior mean of each effect by feature name (the level included)."""
        return {name: float(self.mean[i]) for i, name in enumerate(self.features.names)}


@dataclass(frozen=True)
class _Design:
    """Observations as the regression sees them: one feature row, ln(speedup) and noise variance each."""

    x: np.ndarray
    y: np.ndarray
    noise: np.ndarray

    @classmethod
    def of(cls, features: Features, observations: Sequence[Observation]) -> _Design:
        """Each observation's variance is MEASUREMENT_SD² / n + MODEL_SD²."""
        return cls(
            x=features.matrix(o.params for o in observations),
            y=np.array([o.mean for o in observations]),
            noise=MEASUREMENT_SD**2 / np.array([max(o.n, 1) for o in observations]) + MODEL_SD**2,
        )


def fit(
    features: Features,
    observations: Sequence[Observation],
    prior_mean: Mapping[str, float] | None = None,
) -> Posterior:
    """The posterior of the effects given ``observations`` and, per feature name, prior means (0 where
    none is given)."""
    return _fit(features, _Design.of(features, observations), features.vector(prior_mean or {}))


def _fit(features: Features, design: _Design, mu0: np.ndarray) -> Posterior:
    prior_precision = 1.0 / features.prior_sd() ** 2
    weight = 1.0 / design.noise
    precision = np.diag(prior_precision) + (design.x.T * weight) @ design.x
    shift = prior_precision * mu0 + design.x.T @ (weight * design.y)
    chol = np.linalg.cholesky(precision)
    mean = np.linalg.solve(chol.T, np.linalg.solve(chol, shift))
    return Posterior(features, mean, chol, len(design.y))


def _log_evidence(features: Features, design: _Design, mu0: np.ndarray) -> float:
    """ln p(observations | prior): under the model, y ~ N(X mu0, X S0 Xᵀ + D)."""
    if not len(design.y):
        return 0.0
    cov = (design.x * features.prior_sd() ** 2) @ design.x.T + np.diag(design.noise)
    chol = np.linalg.cholesky(cov)
    z = np.linalg.solve(chol, design.y - design.x @ mu0)
    return float(-0.5 * z @ z - np.log(np.diag(chol)).sum() - 0.5 * len(design.y) * math.log(2 * math.pi))


@dataclass(frozen=True)
class Mixture:
    """Two posteriors, one from the plain prior and one from a transferred prior, weighed by how well each
    prior predicted the problem's own measurements."""

    plain: Posterior
    transferred: Posterior
    weight: float
    """Posterior probability that the transferred prior is the right one."""

    @property
    def features(self) -> Features:
        """The features both posteriors share."""
        return self.plain.features

    @property
    def observations(self) -> int:
        """How many measured settings both were fitted to."""
        return self.plain.observations

    @property
    def mean(self) -> np.ndarray:
        """The mixture's mean effects (predictions are linear in them, so this is the mean prediction)."""
        return (1.0 - self.weight) * self.plain.mean + self.weight * self.transferred.mean

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One draw: first which prior holds, then the effects under it."""
        chosen = self.transferred if rng.uniform() < self.weight else self.plain
        return chosen.sample(rng)


def fit_with_transfer(
    features: Features, observations: Sequence[Observation], transferred: Mapping[str, float]
) -> Posterior | Mixture:
    """The posterior given ``observations``; with ``transferred`` prior means, the mixture of the plain and
    the transferred hypothesis, each weighed by its evidence (prior odds 1:1)."""
    design = _Design.of(features, observations)
    zero = np.zeros(len(features.names))
    plain = _fit(features, design, zero)
    if not transferred:
        return plain
    mu0 = features.vector(transferred)
    moved = _fit(features, design, mu0)
    log_odds = _log_evidence(features, design, zero) - _log_evidence(features, design, mu0)
    weight = 1.0 / (1.0 + math.exp(min(log_odds, 700.0)))
    return Mixture(plain, moved, weight)


def transferred_means(own: Features, sibling: Posterior) -> dict[str, float]:
    """Prior means for ``own``'s effects from a sibling problem's posterior: the effects of the parameter
    values (and pairs of them) both templates have. The level is not transferred: each problem has its own
    baseline."""
    shared = set(own.names) & set(sibling.features.names) - {"level"}
    means = sibling.named_mean()
    return {name: means[name] for name in sorted(shared)}
