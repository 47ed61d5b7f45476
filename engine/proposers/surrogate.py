"""A surrogate model of how fast a template setting runs, for the search proposer.

ln(speedup over numpy) of a setting is modelled as a level plus one effect per parameter value plus one
effect per pair of parameter values (``FUSED=0&NT=1``), with a Gaussian prior on every effect, fitted to
the measured settings by Bayesian linear regression. Pairs matter because the best kernels are often
combinations whose parts do little alone: rmsnorm's streaming stores (NT=1) pay only in the two-pass
variant (FUSED=0); a sum of main effects averages that away.

The posterior is exact (a Gaussian): the proposer uses its mean (exploitation) and its covariance (upper
bounds); a whole plausible model can also be drawn at once. Prior means may come from another problem of the same
family (transfer): effects of parameter values both templates share, such as ``SIMD=1`` or ``NT=1``.

Transfer can mislead: the same knob may pay on one problem and cost on another (streaming stores help a
memory-bound rmsnorm and slow a compute-bound softmax). So a transferred prior is one of two hypotheses,
weighed against the plain prior by how well each predicted the problem's own measurements (Bayesian model
averaging with the closed-form marginal likelihood): before any own evidence they count half each, and a
few measurements that contradict the family's lessons switch them off.

How large effects and noise are differs between problems and machines (a quiet machine's readings agree to
2%, a shared one's to 20%; one template's knobs matter by 2x, another's by 5%), so the prior spreads and the
noise are not fixed: with a few measurements of its own the model takes the :class:`Scales` of a small grid
under which those measurements were most probable (empirical Bayes, the closed-form marginal likelihood).
A pair's prior spread shrinks with the number of pairs a setting switches on, so a template with ten knobs
(45 pairs per setting) does not predict from pair noise before it has seen a pair twice.

Knobs differ in how much they matter: on matmul, the register block (MR, NR, VEC) moves speed by 2x and the
cache blocks (KB, MB, NB) by a few percent. One main-effect spread shared by every parameter is then too small
for the first and too large for the others, and the fit spreads a slow reading over all of a setting's values.
With RELEVANCE_MIN_OBSERVATIONS measurements the empirical Bayes step also gives each parameter its own factor
on the main spread (automatic relevance determination, by coordinate search over RELEVANCE_GRID). Replayed on
this machine's seven landscapes (100 searches per problem, seeds 0-99, the search proposer; scores 0 = random
search, 1 = the optimum; mean over the problems at budgets 8 / 16 / 32): one shared spread 0.27 / 0.42 / 0.72,
relevance from 12 readings 0.27 / 0.43 / 0.79. At 32 add_rmsnorm rose from 0.64 to 0.91 and matmul from 0.18 to
0.35; kda fell from 0.99 to 0.94 and softmax at 16 from 0.27 to 0.21. The pairs keep one shared spread: giving
them their knobs' relevance too scored lower (seeds 1000-1049, relevance from 8 readings: 0.41 / 0.78 at 16 / 32
against 0.49 / 0.83 for the main effects alone).

Some knobs are scales (an accumulator count, a block size): a fast ACC=4 says something of ACC=8 that it does not
say of ACC=1. The prior correlates the effects of such a knob's values, the more the closer they lie
(ORDINAL_CORRELATION); every other prior is independent.

A reading whose interval is wide counts for less: an observation may carry the variance of one reading
(from its benchmark intervals), which replaces the noise where it is larger.
"""

from __future__ import annotations

import dataclasses
import functools
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
"""Prior spread of one pair's interaction effect in a template of five parameters (ten pairs per setting):
smaller than a main effect, but not negligible (a value tried once in a bad combination must stay worth
trying in another). With more parameters it shrinks so that the pairs of a setting add up to the same
spread (see pair_prior_sd); empirical Bayes scales it (PAIR_SCALE_GRID) to what the measurements show."""

RELEVANCE_GRID = (0.1, 0.3, 1.0, 2.0, 4.0)
"""Factors tried on one parameter's main-effect spread (its relevance), relative to the fitted main spread."""

RELEVANCE_MIN_OBSERVATIONS = 12
"""Measured settings from which each parameter's relevance is estimated (below: 1 for every parameter). From 8
it scored a little lower at budget 16 (kda and l2norm lost 0.08-0.1) for the same gain at 32."""

RELEVANCE_SWEEPS = 2
"""Passes of the coordinate search over the parameters' relevances."""

REFERENCE_PAIRS = 10
"""Pairs per setting at which a pair's prior spread is PAIR_PRIOR_SD."""

MEASUREMENT_SD = 0.08
"""Spread of one measurement of a setting's ln(speedup) between benchmarks (a shared machine swings
by several percent from run to run): the noise before the model has measurements to estimate it."""

EMPIRICAL_MIN_OBSERVATIONS = 4
"""Measured settings from which the Scales are estimated rather than assumed."""

EMPIRICAL_MAX_OBSERVATIONS = 96
"""Most (the most recent) observations the Scales are estimated from: enough to tell the grid's points
apart, few enough that a long history does not make every proposal slower."""

MAIN_SD_GRID = (0.1, 0.3, 0.6)
"""Main-effect spreads tried by empirical Bayes (MAIN_PRIOR_SD is the default)."""

PAIR_SCALE_GRID = (0.3, 1.0, 2.0)
"""Pair spreads tried, relative to pair_prior_sd."""

NOISE_SD_GRID = (0.03, 0.08, 0.2)
"""Measurement noise spreads tried (MEASUREMENT_SD is the default)."""

ORDINAL_CORRELATION = 0.5
"""Prior correlation of the effects of two neighbouring values of a scale: a knob of ORDINAL_MIN_VALUES positive
numbers or more (an accumulator count, a block size, a polynomial degree), falling off as its power with the number
of values between them: a fast ACC=4 makes ACC=8 more promising than ACC=1. A knob with a 0 is left out: a zero
often means off or another form (PF=0 no prefetch, CHUNK=0 the recurrent form, PIPE=0 a variant), not the small end
of a scale. 0 treats every value on its own. Replayed on this machine's seven landscapes (seeds 0-39 and 1000-1039,
40 searches per problem each; mean score over the problems at budgets 8 / 16 / 32, 0 = random search, 1 = the
optimum): 0 scored 0.29 / 0.46 / 0.81 and 0.36 / 0.47 / 0.84, 0.5 0.28 / 0.48 / 0.87 and 0.33 / 0.52 / 0.84 (0.3
0.26 / 0.46 / 0.82 and 0.7 0.23 / 0.48 / 0.84 on the first set). Matmul, whose register and cache blocks are all
scales, gained on both sets (at 16 0.24 -> 0.36 and -0.02 -> 0.16, at 32 0.22 -> 0.60 and 0.36 -> 0.52); softmax
lost at 16 on both (0.31 -> 0.26, 0.62 -> 0.43): its ROWS, UNROLL and EXP are not smooth there. Letting empirical
Bayes choose between 0 and 0.5 gave the same searches as 0.5 nearly everywhere. Transfer replays (leave-one-out
over the five row reductions, seeds 0-39; median evaluations to 95% of the optimum, transfer over cold): 0 rmsnorm
0.09, l2norm 0.43, add_rmsnorm 1.07, softmax 1.40, layernorm 0.08; 0.5 0.10, 0.58, 1.25, 1.71, 0.17 -- the cold
searches got faster (add_rmsnorm 15.5 -> 14, softmax 10 -> 8.5 evaluations), the transferred ones a little
slower; the same three of five stay under 0.75."""

ORDINAL_MIN_VALUES = 3
"""Fewest values of a numeric knob whose effects are correlated: with two, a correlation would only shrink the
difference between them (a switch such as NT=0/1 is not a scale)."""

MODEL_SD = 0.03
"""What no amount of repeating a measurement removes: effects of three or more parameters together,
which the model leaves out."""


@dataclass(frozen=True)
class Observation:
    """What was measured of one setting: the mean of ``n`` samples of ln(speedup)."""

    params: Mapping[str, Any]
    mean: float
    n: int
    reading_var: float | None = None
    """Variance of one reading of ln(speedup) from its benchmark intervals, when known: a wide interval
    makes the observation count for less."""


@dataclass(frozen=True)
class Scales:
    """The model's spreads: of a main effect, of a pair effect and of one reading."""

    main_sd: float = MAIN_PRIOR_SD
    pair_sd: float = PAIR_PRIOR_SD
    noise_sd: float = MEASUREMENT_SD
    relevance: tuple[tuple[str, float], ...] = ()
    """Per parameter, a factor on the spread of its values' effects (1 where not named)."""
    model_sd: float = MODEL_SD
    """Spread of what the model leaves out (effects of three or more parameters together), added to every
    observation's variance however often it was read."""

    def widened(self, pair_factor: float, main_factor: float = 1.0, model_sd: float | None = None) -> Scales:
        """These Scales with the pair spread ``pair_factor`` and the main-effect spread ``main_factor`` times
        larger and, when given, ``model_sd`` as the spread of what the model leaves out (an explorer's model)."""
        return dataclasses.replace(
            self,
            main_sd=self.main_sd * main_factor,
            pair_sd=self.pair_sd * pair_factor,
            model_sd=self.model_sd if model_sd is None else model_sd,
        )


def pair_prior_sd(parameters: int) -> float:
    """PAIR_PRIOR_SD for a template of ``parameters`` parameters: the pairs a setting switches on add up to
    the spread ten pairs of PAIR_PRIOR_SD would have."""
    pairs = max(parameters * (parameters - 1) // 2, 1)
    return PAIR_PRIOR_SD * min(1.0, math.sqrt(REFERENCE_PAIRS / pairs))


def _key(name: str, value: Any) -> str:
    return f"{name}={value}"


class Features:
    """The model's features for one template space: a level, each parameter value, each pair of values."""

    def __init__(self, space: Mapping[str, Sequence[Any]]) -> None:
        names = sorted(space)
        self.parameters = len(names)
        self.names: list[str] = ["level"]
        self.mains: list[str] = [_key(n, v) for n in names for v in space[n]]
        self.pairs: list[str] = [
            f"{_key(a, va)}&{_key(b, vb)}"
            for a, b in itertools.combinations(names, 2)
            for va in space[a]
            for vb in space[b]
        ]
        self.main_of: list[str] = [n for n in names for _ in space[n]]
        """The parameter of each main effect, in the order of ``mains``."""
        self.names += self.mains + self.pairs
        self.index = {name: i for i, name in enumerate(self.names)}
        self.ordinal: list[np.ndarray] = [
            np.array([self.index[_key(n, v)] for v in sorted(space[n])])
            for n in names
            if len(space[n]) >= ORDINAL_MIN_VALUES
            and all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in space[n])
        ]
        """Per numeric knob of ORDINAL_MIN_VALUES values or more: its main effects' columns in the order of its
        values (see ORDINAL_CORRELATION)."""

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

    def default_scales(self) -> Scales:
        """The Scales assumed before any measurement: the pair spread for this many parameters."""
        return Scales(pair_sd=pair_prior_sd(self.parameters))

    def prior_sd(self, scales: Scales | None = None) -> np.ndarray:
        """Each feature's prior spread: LEVEL_PRIOR_SD, the main or the pair spread of ``scales``."""
        scales = scales or self.default_scales()
        sd = np.full(len(self.names), scales.pair_sd)
        sd[0] = LEVEL_PRIOR_SD
        sd[1 : 1 + len(self.mains)] = scales.main_sd
        if scales.relevance:
            factor = dict(scales.relevance)
            sd[1 : 1 + len(self.mains)] *= np.array([factor.get(n, 1.0) for n in self.main_of])
        return sd

    def ordinal_blocks(self, sd: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each ordinal knob's columns and the prior covariance of its values' effects (spreads ``sd``, the
        correlation ORDINAL_CORRELATION to the power of how many values apart they are); none at correlation 0."""
        if ORDINAL_CORRELATION <= 0.0:
            return []
        blocks = []
        for columns in self.ordinal:
            apart = np.abs(np.subtract.outer(np.arange(len(columns)), np.arange(len(columns))))
            blocks.append((columns, np.outer(sd[columns], sd[columns]) * ORDINAL_CORRELATION**apart))
        return blocks

    def prior_precision(self, scales: Scales) -> np.ndarray:
        """The inverse of the effects' prior covariance: diagonal but for the ordinal knobs' blocks."""
        sd = self.prior_sd(scales)
        precision = np.diag(1.0 / sd**2)
        for columns, covariance in self.ordinal_blocks(sd):
            precision[np.ix_(columns, columns)] = np.linalg.inv(covariance)
        return precision


@dataclass(frozen=True)
class Posterior:
    """The effects' posterior: N(mean, precision⁻¹), with ``chol`` the Cholesky factor of the precision."""

    features: Features
    mean: np.ndarray
    chol: np.ndarray
    observations: int
    scales: Scales

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One draw of every effect together."""
        z = rng.standard_normal(len(self.mean))
        # precision = L Lᵀ, so w = mean + L⁻ᵀ z has covariance precision⁻¹.
        return self.mean + self._root @ z

    def covariance(self) -> np.ndarray:
        """The effects' posterior covariance, precision⁻¹."""
        return self._root @ self._root.T

    @functools.cached_property
    def _root(self) -> np.ndarray:
        """L⁻ᵀ, inverted once: every later draw is a matrix-vector product instead of a solve."""
        return np.linalg.inv(self.chol.T)

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
    def of(
        cls,
        features: Features,
        observations: Sequence[Observation],
        noise_sd: float,
        x: np.ndarray | None = None,
        model_sd: float = MODEL_SD,
    ) -> _Design:
        """Each observation's variance is max(noise_sd², its reading variance) / n + model_sd²; ``x``: the
        observations' feature rows where the caller has them already."""
        reading = np.array([max(noise_sd**2, o.reading_var or 0.0) for o in observations])
        return cls(
            x=features.matrix(o.params for o in observations) if x is None else x,
            y=np.array([o.mean for o in observations]),
            noise=reading / np.array([max(o.n, 1) for o in observations]) + model_sd**2,
        )


def fit(
    features: Features,
    observations: Sequence[Observation],
    prior_mean: Mapping[str, float] | None = None,
    scales: Scales | None = None,
) -> Posterior:
    """The posterior of the effects given ``observations`` and, per feature name, prior means (0 where
    none is given); with ``scales`` None, the empirical ones (see empirical_scales)."""
    mu0 = features.vector(prior_mean or {})
    scales = scales or empirical_scales(features, observations, mu0)
    return _fit(features, _Design.of(features, observations, scales.noise_sd, model_sd=scales.model_sd), mu0, scales)


def empirical_scales(features: Features, observations: Sequence[Observation], mu0: np.ndarray | None = None) -> Scales:
    """The Scales of the grid (MAIN_SD_GRID × PAIR_SCALE_GRID × NOISE_SD_GRID) under which the most recent
    EMPIRICAL_MAX_OBSERVATIONS observations were most probable, then with RELEVANCE_MIN_OBSERVATIONS each
    parameter's relevance (RELEVANCE_GRID, a coordinate search); the defaults with fewer than
    EMPIRICAL_MIN_OBSERVATIONS."""
    default = features.default_scales()
    if len(observations) < EMPIRICAL_MIN_OBSERVATIONS:
        return default
    recent = list(observations)[-EMPIRICAL_MAX_OBSERVATIONS:]
    mu = np.zeros(len(features.names)) if mu0 is None else mu0
    x = features.matrix(o.params for o in recent)
    best, chosen = -math.inf, default
    designs = {noise_sd: _Design.of(features, recent, noise_sd, x) for noise_sd in NOISE_SD_GRID}
    for noise_sd, design in designs.items():
        for main_sd in MAIN_SD_GRID:
            for pair_scale in PAIR_SCALE_GRID:
                scales = Scales(main_sd, default.pair_sd * pair_scale, noise_sd)
                evidence = _log_evidence(features, design, mu, scales)
                if evidence > best:
                    best, chosen = evidence, scales
    if len(recent) >= RELEVANCE_MIN_OBSERVATIONS and features.parameters > 1:
        # Each parameter's own main-effect spread, by coordinate search from the shared one: see the module
        # docstring ("Knobs differ in how much they matter").
        design = designs.get(chosen.noise_sd) or _Design.of(features, recent, chosen.noise_sd, x)
        factor = {n: 1.0 for n in sorted(set(features.main_of))}
        for _ in range(RELEVANCE_SWEEPS):
            for name in sorted(factor):
                for candidate in RELEVANCE_GRID:
                    trial = {**factor, name: candidate}
                    scales = dataclasses.replace(chosen, relevance=tuple(sorted(trial.items())))
                    evidence = _log_evidence(features, design, mu, scales)
                    if evidence > best + 1e-9:
                        best, factor = evidence, trial
        chosen = dataclasses.replace(chosen, relevance=tuple(sorted(factor.items())))
    return chosen


def _fit(features: Features, design: _Design, mu0: np.ndarray, scales: Scales) -> Posterior:
    prior_precision = features.prior_precision(scales)
    weight = 1.0 / design.noise
    precision = prior_precision + (design.x.T * weight) @ design.x
    shift = prior_precision @ mu0 + design.x.T @ (weight * design.y)
    chol = np.linalg.cholesky(precision)
    mean = np.linalg.solve(chol.T, np.linalg.solve(chol, shift))
    return Posterior(features, mean, chol, len(design.y), scales)


def _log_evidence(features: Features, design: _Design, mu0: np.ndarray, scales: Scales) -> float:
    """ln p(observations | prior): under the model, y ~ N(X mu0, X S0 Xᵀ + D)."""
    if not len(design.y):
        return 0.0
    sd = features.prior_sd(scales)
    cov = (design.x * sd**2) @ design.x.T + np.diag(design.noise)
    for columns, covariance in features.ordinal_blocks(sd):
        # The ordinal blocks' correlations on top of their diagonal, already counted above.
        block = design.x[:, columns]
        cov += block @ (covariance - np.diag(np.diag(covariance))) @ block.T
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

    @property
    def scales(self) -> Scales:
        """The Scales both posteriors share."""
        return self.plain.scales

    def covariance(self) -> np.ndarray:
        """The mixture's covariance: each posterior's, weighed, plus the spread between their means."""
        gap = self.transferred.mean - self.plain.mean
        return (
            (1.0 - self.weight) * self.plain.covariance()
            + self.weight * self.transferred.covariance()
            + self.weight * (1.0 - self.weight) * np.outer(gap, gap)
        )


def fit_with_transfer(
    features: Features,
    observations: Sequence[Observation],
    transferred: Mapping[str, float],
    scales: Scales | None = None,
) -> Posterior | Mixture:
    """The posterior given ``observations``; with ``transferred`` prior means, the mixture of the plain and
    the transferred hypothesis, each weighed by its evidence (prior odds 1:1). Both share ``scales``, by
    default the Scales the observations suggest under the plain prior."""
    zero = np.zeros(len(features.names))
    scales = scales or empirical_scales(features, observations, zero)
    design = _Design.of(features, observations, scales.noise_sd, model_sd=scales.model_sd)
    plain = _fit(features, design, zero, scales)
    if not transferred:
        return plain
    mu0 = features.vector(transferred)
    moved = _fit(features, design, mu0, scales)
    log_odds = _log_evidence(features, design, zero, scales) - _log_evidence(features, design, mu0, scales)
    weight = 1.0 / (1.0 + math.exp(min(log_odds, 700.0)))
    return Mixture(plain, moved, weight)


def transferred_means(own: Features, sibling: Posterior) -> dict[str, float]:
    """Prior means for ``own``'s effects from a sibling problem's posterior: the effects of the parameter
    values (and pairs of them) both templates have. The level is not transferred: each problem has its own
    baseline."""
    shared = set(own.names) & set(sibling.features.names) - {"level"}
    means = sibling.named_mean()
    return {name: means[name] for name in sorted(shared)}
