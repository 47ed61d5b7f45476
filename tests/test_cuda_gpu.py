"""The CUDA judge on a real GPU: what only a device can show (the driver calls, faults, hangs, event timing).

Marked ``gpu`` and skipped, with the reason, where this machine has no usable GPU. Everything that needs no
GPU is tested on the CPU in tests/test_cuda_runtime.py. Run on a GPU machine with::

    python -m pytest -m gpu tests/test_cuda_gpu.py -p no:cacheprovider --noconftest -o addopts=""

(scripts/gpu_check.sh does, with the options a machine without the project's test dependencies needs).
This module imports only what the CUDA judge needs: numpy, pydantic, psutil and cuda-python.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.harness.benchmarking import Reference
from engine.harness.verdicts import Verdict
from engine.problems import Problem, builtin_problems, load_problem
from engine.targets import scan_gpus

SCAN = scan_gpus()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not SCAN.gpus, reason=f"no GPU: {SCAN.reason}"),
]
# A kernel that never finishes is stopped after this; the verdict must say timeout, not hang the test.
HANG_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def backend() -> object:
    from engine.harness.backend import backend_for

    return backend_for(SCAN.gpus[0].target)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kf-cuda-cache")


def build(backend: object, problem: Problem, source: str, cache: Path) -> str:
    result = backend.compile(problem, source, cache_dir=cache)  # type: ignore[attr-defined]
    assert result.verdict == Verdict.ok and result.artifact_id, f"{result.error_category}: {result.first_error}"
    return str(result.artifact_id)


def softmax() -> Problem:
    if "softmax" not in builtin_problems("cuda"):
        pytest.skip("the softmax problem has no CUDA kernel")
    return load_problem("softmax").for_backend("cuda")


def softmax_kernel(body: str) -> str:
    """A softmax-ABI kernel, one block of 256 threads per row, with ``body`` as its code."""
    return f"// kf-launch: grid=(rows, 1, 1) block=(256, 1, 1) shared=0\n{softmax().signature} {{\n{body}\n}}\n"


COPY = """
    const long long row = blockIdx.x;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) y[row * cols + c] = x[row * cols + c];
"""


@pytest.mark.parametrize("name", builtin_problems("cuda") or ["(none)"])
def test_seed_kernels_validate_ok(backend: object, cache: Path, name: str) -> None:
    if name == "(none)":
        pytest.skip("no built-in problem has a CUDA kernel")
    problem = load_problem(name).for_backend("cuda")
    artifact = build(backend, problem, problem.seed_source(), cache)
    report = backend.validate(problem, artifact, cache_dir=cache)  # type: ignore[attr-defined]
    assert report.verdict == Verdict.ok, f"{report.message}\n{report.output_tail}"
    assert report.trials > 0


def test_a_wrong_kernel_is_incorrect(backend: object, cache: Path) -> None:
    problem = softmax()
    artifact = build(backend, problem, softmax_kernel(COPY), cache)  # y = x: not a softmax
    report = backend.validate(problem, artifact, cache_dir=cache)  # type: ignore[attr-defined]
    assert report.verdict == Verdict.incorrect, report.message
    assert report.cases[0].check == "output"


def test_a_write_past_the_end_changes_the_guard(backend: object, cache: Path) -> None:
    problem = softmax()
    past_the_end = COPY + "    if (blockIdx.x == 0) y[rows * cols + threadIdx.x] = 1.0f;\n"
    artifact = build(backend, problem, softmax_kernel(past_the_end), cache)
    report = backend.validate(problem, artifact, cache_dir=cache)  # type: ignore[attr-defined]
    assert report.verdict == Verdict.incorrect, report.message
    assert report.cases[0].check == "guard_after" and report.cases[0].output == "y"


def test_an_illegal_address_is_a_crash_and_the_judge_goes_on(backend: object, cache: Path) -> None:
    problem = softmax()
    far_away = COPY + "    if (threadIdx.x == 0) y[(1LL << 40) + blockIdx.x] = 1.0f;\n"
    artifact = build(backend, problem, softmax_kernel(far_away), cache)
    crashed = backend.validate(problem, artifact, cache_dir=cache)  # type: ignore[attr-defined]
    assert crashed.verdict == Verdict.crash, crashed.message
    assert "CUDA_ERROR" in crashed.message
    seed = build(backend, problem, problem.seed_source(), cache)
    again = backend.validate(problem, seed, cache_dir=cache)  # type: ignore[attr-defined]
    assert again.verdict == Verdict.ok, f"the GPU did not recover after a crash: {again.message}"


def test_an_endless_loop_is_a_timeout_and_the_judge_goes_on(cache: Path, backend: object) -> None:
    from engine.harness.cuda.judge import validate_cuda

    problem = softmax()
    # clock64() is volatile: the compiler may not remove the loop, and it never ends (the counter is positive).
    endless = "    long long t = clock64();\n    while (t >= 0) { t = clock64(); }\n    y[0] = (float)t;\n"
    artifact = build(backend, problem, softmax_kernel(endless), cache)
    hung = validate_cuda(problem, artifact, cache_dir=cache, call_timeout_s=HANG_TIMEOUT_S)
    assert hung.verdict == Verdict.timeout, hung.message
    seed = build(backend, problem, problem.seed_source(), cache)
    again = validate_cuda(problem, seed, cache_dir=cache)
    assert again.verdict == Verdict.ok, f"the GPU did not recover after a hung kernel: {again.message}"


def test_an_a_to_a_interval_contains_one(backend: object, cache: Path) -> None:
    problem = softmax()
    seed = build(backend, problem, problem.seed_source(), cache)
    (report,) = backend.benchmark(  # type: ignore[attr-defined]
        problem, seed, [Reference(kind="artifact", artifact_id=seed, label="seed")], budget_s=1.0, cache_dir=cache
    )
    assert report.verdict == Verdict.ok, report.message
    assert report.ci_low <= 1.0 <= report.ci_high, f"A/A interval [{report.ci_low}, {report.ci_high}]"
    assert report.revalidated
    assert report.roofline_fraction is not None and 0 < report.roofline_fraction < 3
    gpu = report.hardware.gpu
    assert gpu is not None and gpu.hbm_bandwidth_gbs and gpu.hbm_bandwidth_gbs > 100
