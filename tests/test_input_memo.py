"""Benchmark inputs kept between benchmarks (engine/harness/input_memo.py): generated once per problem
definition, shape, distribution and seed, read-only, and dropped oldest first past the memo's size."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.harness import input_memo
from engine.harness.benchmarking import Reference, benchmark_artifact
from engine.harness.cpu import compile_source
from engine.harness.verdicts import Verdict
from engine.problems import Problem, load_problem

COPY_PROBLEM = Path(__file__).resolve().parent.parent / "bench" / "problems" / "copy"


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    input_memo.forget()
    yield
    input_memo.forget()


def counting(calls: list[int], n: int) -> Any:
    def generate() -> dict[str, Any]:
        calls.append(n)
        return {"x": np.arange(n, dtype=np.float32), "eps": 1e-5}

    return generate


def test_the_same_inputs_are_generated_once_and_cannot_be_changed() -> None:
    calls: list[int] = []
    first = input_memo.memoized_inputs("def-a", {"n": 4}, "normal", 7, counting(calls, 4))
    again = input_memo.memoized_inputs("def-a", {"n": 4}, "normal", 7, counting(calls, 4))
    assert again is first and calls == [4]
    with pytest.raises(ValueError, match="read-only"):
        first["x"][0] = 1.0
    # Another seed, shape, distribution or problem definition is other inputs.
    input_memo.memoized_inputs("def-a", {"n": 4}, "normal", 8, counting(calls, 4))
    input_memo.memoized_inputs("def-a", {"n": 5}, "normal", 7, counting(calls, 5))
    input_memo.memoized_inputs("def-a", {"n": 4}, "uniform", 7, counting(calls, 4))
    input_memo.memoized_inputs("def-b", {"n": 4}, "normal", 7, counting(calls, 4))
    assert calls == [4, 4, 5, 4, 4]


def test_the_oldest_inputs_go_first_once_the_memo_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_memo, "MEMO_BYTES", 3 * 400)  # three sets of 100 float32
    calls: list[int] = []
    for seed in range(4):
        input_memo.memoized_inputs("def", {"n": 100}, "normal", seed, counting(calls, 100))
    input_memo.memoized_inputs("def", {"n": 100}, "normal", 3, counting(calls, 100))  # kept: the newest
    input_memo.memoized_inputs("def", {"n": 100}, "normal", 1, counting(calls, 100))  # kept, now the newest
    assert len(calls) == 4
    input_memo.memoized_inputs("def", {"n": 100}, "normal", 0, counting(calls, 100))  # dropped: the oldest
    assert len(calls) == 5


def test_a_second_benchmark_of_the_same_seed_reuses_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = load_problem(str(COPY_PROBLEM))
    compiled = compile_source(problem, problem.seed_source(), cache_dir=tmp_path)
    assert compiled.verdict == Verdict.ok and compiled.artifact_id
    generated: list[dict[str, int]] = []
    make_inputs = Problem.make_inputs

    def counted(self: Problem, shape: dict[str, int], distribution: str, seed: int) -> dict[str, Any]:
        generated.append(shape)
        return make_inputs(self, shape, distribution, seed)

    monkeypatch.setattr(Problem, "make_inputs", counted)
    pool_shape = problem.benchmark_shapes[0][0]

    def pools_generated(seed: int) -> int:
        generated.clear()
        (report,) = benchmark_artifact(
            problem,
            compiled.artifact_id,
            [Reference(kind="numpy", label="numpy")],
            budget_s=0.2,
            seed=seed,
            cache_dir=tmp_path,
        )
        assert report.verdict == Verdict.ok, report.message
        return sum(shape == pool_shape for shape in generated)

    first = pools_generated(seed=0)
    assert first >= 2  # one input set per slot of the pool
    assert pools_generated(seed=0) == 0  # the same seed again: the kept pool
    assert pools_generated(seed=1) == first  # another seed: another pool
