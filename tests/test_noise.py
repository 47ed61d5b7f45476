"""Intervals at the confidence asked for, and the run-level noise floor measured per machine."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from engine.hardware import hardware_fingerprint, hardware_key
from engine.harness import noise
from engine.harness.noise import MAX_FLOOR, MIN_FLOOR, NoiseFloor, estimate_floor, machine_noise_floor
from engine.harness.stats import speedup_with_intervals


def noisy_pairs(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two shapes of paired timings: the candidate twice as fast, with 5% noise per call."""
    rng = np.random.default_rng(seed)
    pairs = []
    for rounds in (60, 90):
        candidate = rng.normal(100.0, 5.0, rounds)
        pairs.append((2.0 * candidate * rng.normal(1.0, 0.05, rounds), candidate))
    return pairs


def width(low: float, high: float) -> float:
    return float(np.log(high) - np.log(low))


def test_interval_narrows_with_lower_confidence() -> None:
    pairs = noisy_pairs()
    narrow, narrow_shapes = speedup_with_intervals(pairs, [1.0, 2.0], confidence=0.8, noise_floor=0.01)
    wide, wide_shapes = speedup_with_intervals(pairs, [1.0, 2.0], confidence=0.99, noise_floor=0.01)
    assert narrow.ratio == wide.ratio
    assert width(narrow.ci_low, narrow.ci_high) < width(wide.ci_low, wide.ci_high)
    for a, b in zip(narrow_shapes, wide_shapes, strict=True):
        assert width(a.ci_low, a.ci_high) < width(b.ci_low, b.ci_high)


@pytest.mark.parametrize("confidence", [0.5, 1.0, 0.3, 95.0, float("nan")])
def test_invalid_confidence_is_refused(confidence: float) -> None:
    with pytest.raises(ValueError, match=r"confidence must be strictly between 0.5 and 1.*got"):
        speedup_with_intervals(noisy_pairs(), [1.0, 1.0], confidence=confidence)


def test_negative_noise_floor_is_refused() -> None:
    with pytest.raises(ValueError, match=r"noise_floor .* must be 0 or more"):
        speedup_with_intervals(noisy_pairs(), [1.0, 1.0], noise_floor=-0.01)


def test_noise_floor_widens_the_interval() -> None:
    pairs = noisy_pairs()
    bare, bare_shapes = speedup_with_intervals(pairs, [1.0, 1.0], noise_floor=0.0)
    floored, floored_shapes = speedup_with_intervals(pairs, [1.0, 1.0], noise_floor=0.05)
    assert bare.ratio == floored.ratio
    assert floored.ci_low < bare.ci_low and bare.ci_high < floored.ci_high
    for a, b in zip(bare_shapes, floored_shapes, strict=True):
        assert b.ci_low < a.ci_low and a.ci_high < b.ci_high


def synthetic_runs(
    shapes: int, runs: int, run_sd: float, within: float, seed: int = 0
) -> tuple[list[list[float]], list[list[float]]]:
    """A/A log ratios: per run, the bootstrap's noise (sd ``within``, which the run reports) plus a run-level
    effect (sd ``run_sd``, which it does not)."""
    rng = np.random.default_rng(seed)
    logs = rng.normal(0.0, within, (shapes, runs)) + rng.normal(0.0, run_sd, (shapes, runs))
    return logs.tolist(), np.full((shapes, runs), within).tolist()


def test_floor_estimate_recovers_a_known_spread() -> None:
    estimate = estimate_floor(*synthetic_runs(shapes=500, runs=4, run_sd=0.02, within=0.01))
    assert estimate.degrees_of_freedom == 1500
    assert estimate.point == pytest.approx(0.02, rel=0.1)
    # Many degrees of freedom: the upper bound is barely above the point estimate, and is the floor.
    assert estimate.point < estimate.upper < 1.15 * estimate.point
    assert estimate.floor == estimate.upper and not estimate.warning


def test_floor_estimate_errs_towards_coverage_with_few_runs() -> None:
    # The calibration's own size: 7 shapes, 4 runs each.
    for seed in range(5):
        estimate = estimate_floor(*synthetic_runs(shapes=7, runs=4, run_sd=0.02, within=0.01, seed=seed))
        assert estimate.degrees_of_freedom == 21
        assert estimate.upper > estimate.point


def test_floor_estimate_bounds() -> None:
    quiet = estimate_floor(*synthetic_runs(shapes=200, runs=4, run_sd=0.0, within=0.01))
    assert quiet.upper < MIN_FLOOR and quiet.floor == MIN_FLOOR and not quiet.warning
    loud = estimate_floor(*synthetic_runs(shapes=7, runs=4, run_sd=0.2, within=0.01))
    assert loud.upper > MAX_FLOOR and loud.floor == MAX_FLOOR
    assert "above the 5% cap" in loud.warning


def test_floor_estimate_needs_two_runs_of_a_shape() -> None:
    with pytest.raises(ValueError, match="two runs or more"):
        estimate_floor([[0.01], [0.02]], [[0.01], [0.01]])
    with pytest.raises(ValueError, match="one within-run deviation per run"):
        estimate_floor([[0.01, 0.02]], [[0.01]])


@pytest.fixture
def fresh_memo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An empty in-process memo, so a call reads the cache folder (or measures) as a new process would; and
    the cache folder's own machine/ (not the session's shared KF_MACHINE_DIR)."""
    monkeypatch.setattr(noise, "_floor_memo", {})
    monkeypatch.delenv("KF_MACHINE_DIR", raising=False)
    yield


def this_machine_key(threads: int = 1) -> str:
    return f"{hardware_key(hardware_fingerprint(threads))}-t{threads}"


def recorded_floor(key: str, floor: float) -> NoiseFloor:
    return NoiseFloor(
        key=key,
        threads=1,
        floor=floor,
        point=floor,
        upper=floor,
        upper_bound_level=0.9,
        min_floor=MIN_FLOOR,
        max_floor=MAX_FLOOR,
        degrees_of_freedom=21,
        runs=4,
        budget_s=0.5,
        shapes=[],
        cpus_exclusive=True,
        load_average=0.0,
        measured_at=datetime.now(UTC),
        seconds=1.0,
        estimator=noise.ESTIMATOR,
    )


def test_another_machines_floor_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_memo: None) -> None:
    key = this_machine_key()
    folder = tmp_path / "machine"
    folder.mkdir()
    # A record copied from another machine into this machine's file name, and one under its own name.
    (folder / f"noise-{key}.json").write_text(recorded_floor("0123456789abcdef-t1", 0.04).model_dump_json())
    (folder / "noise-0123456789abcdef-t1.json").write_text(
        recorded_floor("0123456789abcdef-t1", 0.04).model_dump_json()
    )
    measured: list[str] = []

    def measure(key: str, threads: int, cache_dir: Path | None, isolation: str) -> NoiseFloor:
        measured.append(key)
        return recorded_floor(key, 0.007)

    monkeypatch.setattr(noise, "_measure", measure)
    assert machine_noise_floor(cache_dir=tmp_path).floor == 0.007
    assert measured == [key]
    # The measurement replaced the foreign record on disk.
    assert NoiseFloor.model_validate_json((folder / f"noise-{key}.json").read_text()).key == key


def benchmark_takes_noise_floor() -> bool:
    """False while the harness rewrite is under way: benchmark_artifact does not import or lacks noise_floor."""
    try:
        from engine.harness.benchmarking import benchmark_artifact
    except ImportError:
        return False
    return "noise_floor" in inspect.signature(benchmark_artifact).parameters


@pytest.mark.skipif(
    not benchmark_takes_noise_floor(),
    reason="engine.harness.benchmarking does not import, or its benchmark_artifact takes no noise_floor yet "
    "(the harness rewrite adds it)",
)
def test_machine_noise_floor_is_measured_once_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_memo: None
) -> None:
    # The real A/A runs, as short as they go: this checks the plumbing, not the figure.
    monkeypatch.setattr(noise, "RUNS_PER_PROBLEM", 2)
    monkeypatch.setattr(noise, "RUN_BUDGET_S", 0.1)
    first = machine_noise_floor(cache_dir=tmp_path)
    assert first.key == this_machine_key() and first.runs == 2 and first.degrees_of_freedom == 7
    assert MIN_FLOOR <= first.floor <= MAX_FLOOR
    assert {s.problem for s in first.shapes} == {"softmax", "rmsnorm"}
    assert all(len(s.log_ratios) == len(s.within_sd) == 2 for s in first.shapes)
    assert machine_noise_floor(cache_dir=tmp_path) is first

    def measure_again(key: str, threads: int, cache_dir: Path | None, isolation: str) -> NoiseFloor:
        raise AssertionError("the cached noise floor should have been read, not measured again")

    monkeypatch.setattr(noise, "_measure", measure_again)
    monkeypatch.setattr(noise, "_floor_memo", {})
    assert machine_noise_floor(cache_dir=tmp_path) == first
