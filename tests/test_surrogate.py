"""The surrogate model: Bayesian linear regression over parameter values and pairs of them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.proposers import surrogate
from engine.proposers.surrogate import (
    MODEL_SD,
    RELEVANCE_MIN_OBSERVATIONS,
    Features,
    Mixture,
    Observation,
    Scales,
    empirical_scales,
    fit,
    fit_with_transfer,
    transferred_means,
)

SPACE = {"A": [0, 1], "B": [0, 1], "C": [1, 2, 4]}


def settings() -> list[dict[str, int]]:
    return [{"A": a, "B": b, "C": c} for a in SPACE["A"] for b in SPACE["B"] for c in SPACE["C"]]


def speed(s: dict[str, int]) -> float:
    """ln(speedup): C helps a little; A=1 with B=1 helps a lot, either alone hurts."""
    together = 0.5 if s["A"] == 1 and s["B"] == 1 else (-0.2 if s["A"] != s["B"] else 0.0)
    return 0.7 + 0.05 * math.log2(s["C"]) + together


def test_features_name_values_and_pairs() -> None:
    features = Features(SPACE)
    assert features.names[0] == "level"
    assert "A=1" in features.mains and "A=1&B=1" in features.pairs and "B=0&C=4" in features.pairs
    row = features.matrix([{"A": 1, "B": 0, "C": 2}])[0]
    on = {features.names[i] for i in np.flatnonzero(row)}
    assert on == {"level", "A=1", "B=0", "C=2", "A=1&B=0", "A=1&C=2", "B=0&C=2"}


def test_fit_predicts_an_unmeasured_combination_of_an_interaction() -> None:
    features = Features(SPACE)
    measured = [s for s in settings() if (s["A"], s["B"], s["C"]) != (1, 1, 4)]
    posterior = fit(features, [Observation(s, speed(s), 3) for s in measured])
    predicted = features.matrix(settings()) @ posterior.mean
    best = settings()[int(np.argmax(predicted))]
    # The unmeasured A=1 B=1 C=4 is the fastest setting; the model ranks it first from its parts.
    assert best == {"A": 1, "B": 1, "C": 4}
    errors = np.abs(predicted - np.array([speed(s) for s in settings()]))
    assert float(errors.max()) < 0.1


def test_evidence_narrows_the_posterior() -> None:
    features = Features(SPACE)
    rng = np.random.default_rng(0)
    x = features.matrix([{"A": 1, "B": 1, "C": 1}])[0]
    prior = fit(features, [])
    informed = fit(features, [Observation(s, speed(s), 4) for s in settings()])
    spread_prior = np.std([x @ prior.sample(rng) for _ in range(400)])
    spread_informed = np.std([x @ informed.sample(rng) for _ in range(400)])
    assert spread_informed < spread_prior / 5


def test_transfer_keeps_shared_effects_but_not_the_level() -> None:
    sibling = Features({"A": [0, 1], "D": [0, 1]})
    posterior = fit(sibling, [Observation({"A": a, "D": d}, 1.0 + 0.4 * a, 4) for a in (0, 1) for d in (0, 1)])
    means = transferred_means(Features(SPACE), posterior)
    assert set(means) == {"A=0", "A=1"}
    assert means["A=1"] - means["A=0"] > 0.2


def test_a_transferred_prior_is_dropped_when_own_measurements_contradict_it() -> None:
    features = Features(SPACE)
    family = {"A=1": 0.3, "A=0": -0.3}
    untested = fit_with_transfer(features, [], family)
    assert isinstance(untested, Mixture) and untested.weight == 0.5

    def measured(sign: float) -> list[Observation]:
        return [Observation(s, 1.0 + sign * (0.3 if s["A"] else -0.3), 1) for s in settings()[::2]]

    agreeing = fit_with_transfer(features, measured(+1.0), family)
    contradicting = fit_with_transfer(features, measured(-1.0), family)
    assert isinstance(agreeing, Mixture) and isinstance(contradicting, Mixture)
    assert contradicting.weight < 0.2 < 0.6 < agreeing.weight
    # The mean follows the evidence either way.
    x = features.matrix([{"A": 1, "B": 0, "C": 1}, {"A": 0, "B": 0, "C": 1}])
    high, low = x @ contradicting.mean
    assert low > high


def test_a_reading_with_a_wide_interval_counts_for_less() -> None:
    features = Features(SPACE)
    base = [Observation(s, speed(s), 2) for s in settings()]
    target = {"A": 1, "B": 0, "C": 2}
    x = features.matrix([target])[0]
    scales = features.default_scales()
    # The same surprising reading (2x faster than the model says) with a narrow and with a wide interval.
    narrow = fit(features, [*base, Observation(target, speed(target) + 0.7, 1, reading_var=0.01**2)], scales=scales)
    wide = fit(features, [*base, Observation(target, speed(target) + 0.7, 1, reading_var=0.5**2)], scales=scales)
    assert x @ narrow.mean - speed(target) > 2 * (x @ wide.mean - speed(target)) > 0


def test_the_scales_follow_the_measurements() -> None:
    features = Features(SPACE)
    rng = np.random.default_rng(0)
    quiet = [Observation(s, speed(s) + float(rng.normal(0, 0.01)), 1) for s in settings() * 2]
    noisy = [Observation(s, speed(s) + float(rng.normal(0, 0.3)), 1) for s in settings() * 2]
    assert empirical_scales(features, quiet).noise_sd < empirical_scales(features, noisy).noise_sd


def test_each_knob_gets_the_spread_its_effects_show() -> None:
    """One knob moves speed by 2x, three do nothing: with enough readings the one gets a wider main-effect
    spread than each of the others, and the model ranks the settings by it."""
    space = {"BIG": [1, 2, 4, 6], "P": [0, 1, 2], "Q": [0, 1], "R": [0, 1, 2]}
    features = Features(space)
    rng = np.random.default_rng(3)
    effect = {1: -0.7, 2: -0.3, 4: 0.0, 6: -0.15}
    every = [
        {"BIG": b, "P": p, "Q": q, "R": r}
        for b in space["BIG"]
        for p in space["P"]
        for q in space["Q"]
        for r in space["R"]
    ]
    measured = [every[i] for i in rng.choice(len(every), RELEVANCE_MIN_OBSERVATIONS + 4, replace=False)]
    observations = [Observation(s, effect[s["BIG"]] + float(rng.normal(0, 0.02)), 1) for s in measured]

    scales = empirical_scales(features, observations)

    relevance = dict(scales.relevance)
    assert set(relevance) == set(space)
    assert all(relevance["BIG"] > relevance[other] for other in ("P", "Q", "R")), relevance
    assert empirical_scales(features, observations[: RELEVANCE_MIN_OBSERVATIONS - 1]).relevance == ()
    predicted = features.matrix(every) @ fit(features, observations, scales=scales).mean
    best = every[int(np.argmax(predicted))]
    assert best["BIG"] == 4


def test_what_the_model_leaves_out_bounds_what_repeating_a_reading_teaches() -> None:
    features = Features(SPACE)
    base = [Observation(s, speed(s), 2) for s in settings()]
    target = {"A": 1, "B": 0, "C": 2}
    x = features.matrix([target])[0]
    scales = features.default_scales()
    # One setting read 2x faster than the model says, a hundred times: the readings agree, so only what the
    # model leaves out (effects of three or more parameters) can make them count for less.
    surprise = Observation(target, speed(target) + 0.7, 100)
    tight = fit(features, [*base, surprise], scales=scales)
    loose = fit(features, [*base, surprise], scales=scales.widened(1.0, 1.0, model_sd=0.3))
    assert tight.scales.model_sd == MODEL_SD and loose.scales.model_sd == 0.3
    assert x @ tight.mean - speed(target) > x @ loose.mean - speed(target) > 0
    assert x @ loose.covariance() @ x > 2 * (x @ tight.covariance() @ x)


def test_a_fast_value_of_a_scale_makes_its_neighbours_more_promising_than_the_far_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    space = {"ACC": [1, 2, 4, 8], "NT": [0, 1]}
    features = Features(space)
    measured = [
        Observation({"ACC": 4, "NT": 0}, 0.4, 2),
        Observation({"ACC": 4, "NT": 1}, 0.45, 2),
        Observation({"ACC": 1, "NT": 0}, -0.2, 2),
        Observation({"ACC": 1, "NT": 1}, -0.15, 2),
    ]
    scales = Scales()
    mean = fit(features, measured, scales=scales).named_mean()
    # ACC=8 and ACC=2 are unmeasured: ACC=8 borrows from ACC=4 next to it, ACC=2 from both of its neighbours.
    assert mean["ACC=8"] > 0.05 and mean["ACC=8"] > mean["ACC=2"] > mean["ACC=1"]
    monkeypatch.setattr(surrogate, "ORDINAL_CORRELATION", 0.0)
    alone = fit(features, measured, scales=scales).named_mean()
    assert abs(alone["ACC=8"]) < 1e-9 and abs(alone["ACC=2"]) < 1e-9  # each value on its own: nothing learnt


def test_only_scales_of_three_positive_numbers_or_more_are_ordinal() -> None:
    features = Features({"PF": [0, 1024, 4096], "NT": [0, 1], "ERF": ["a", "b", "c"], "ON": [True, False, True]})
    assert features.ordinal == []
    features = Features({"ROWS": [4, 1, 2], "NT": [0, 1]})
    assert [[features.names[i] for i in block] for block in features.ordinal] == [["ROWS=1", "ROWS=2", "ROWS=4"]]


def test_the_ordinal_prior_gives_the_exact_gaussian_posterior_and_evidence() -> None:
    # The fit (precision form, blocks inverted one by one) against the textbook formulas with the dense prior
    # covariance: mean = mu0 + S0 Xᵀ (X S0 Xᵀ + D)⁻¹ (y - X mu0), and ln N(y; X mu0, X S0 Xᵀ + D).
    space = {"ACC": [1, 2, 4, 8], "ROWS": [1, 2, 4], "NT": [0, 1]}
    features = Features(space)
    rng = np.random.default_rng(3)
    chosen = [{"ACC": a, "ROWS": r, "NT": n} for a in space["ACC"] for r in space["ROWS"] for n in space["NT"]]
    observations = [Observation(s, float(rng.normal(0.3, 0.2)), 2) for s in chosen[::3]]
    scales = Scales(main_sd=0.3, pair_sd=0.1, noise_sd=0.05)
    mu0 = rng.normal(0, 0.05, len(features.names))
    design = surrogate._Design.of(features, observations, scales.noise_sd, model_sd=scales.model_sd)
    sd = features.prior_sd(scales)
    dense = np.diag(sd**2)
    for columns, covariance in features.ordinal_blocks(sd):
        dense[np.ix_(columns, columns)] = covariance
    assert np.allclose(np.linalg.inv(features.prior_precision(scales)), dense)
    marginal = design.x @ dense @ design.x.T + np.diag(design.noise)
    expected = mu0 + dense @ design.x.T @ np.linalg.solve(marginal, design.y - design.x @ mu0)
    assert np.allclose(surrogate._fit(features, design, mu0, scales).mean, expected)
    residual = design.y - design.x @ mu0
    _, logdet = np.linalg.slogdet(marginal)
    quadratic = residual @ np.linalg.solve(marginal, residual)
    log_density = -0.5 * (quadratic + logdet + len(residual) * math.log(2 * math.pi))
    assert surrogate._log_evidence(features, design, mu0, scales) == pytest.approx(log_density)
