"""The CUDA side of the problem-folder format (docs/problems.md, "CUDA kernels"): the CUDA view of a problem,
CUDA-only folders, bfloat16 storage and its tolerances, and the library baselines -- all without a GPU.

The baselines are written against CuPy's numpy-compatible API, so numpy stands in for cupy here: what they
compute is checked on the CPU, and only where it runs changes on a GPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import UserError
from engine.harness.backend import backend_for, backend_kind, problem_for_target
from engine.harness.cuda.arch import arch_of
from engine.problems import Problem, bf16_to_float32, builtin_problems, float32_to_bf16, load_problem
from engine.proposers.random_template import template_space

CUDA_SUITE = ["kda", "rmsnorm", "rmsnorm_bf16", "softmax", "softmax_bf16"]
BF16_SUITE = ["rmsnorm_bf16", "softmax_bf16"]


@pytest.fixture(scope="module", params=CUDA_SUITE)
def cuda_problem(request: pytest.FixtureRequest) -> Problem:
    return load_problem(request.param).for_backend("cuda")


def worst_ratio(problem: Problem, got: dict[str, Any], shape: dict[str, int], inputs: dict[str, Any]) -> float:
    """max |decoded output − reference| / (atol + rtol·|reference|) over every output: ≤ 1 passes."""
    reference = problem.reference(inputs, shape)
    worst = 0.0
    for p in problem.outputs:
        atol, rtol = problem.tolerance(p.dtype, shape, inputs)
        decoded = problem.decode_output(p.name, np.asarray(got[p.name])).astype(np.float64)
        ratio = np.abs(decoded - reference[p.name]) / (atol + rtol * np.abs(reference[p.name]))
        worst = max(worst, float(np.nan_to_num(ratio, nan=np.inf).max(initial=0.0)))
    return worst


def test_bf16_round_trip_is_exact_on_known_values() -> None:
    values = np.array([1.0, -2.0, 0.0, -0.0, 0.15625, 3.0e38, 1.0e-40, np.inf, -np.inf], dtype=np.float32)
    bits = float32_to_bf16(values)
    assert bits.dtype == np.uint16
    assert bits.tolist() == [0x3F80, 0xC000, 0x0000, 0x8000, 0x3E20, 0x7F62, 0x0001, 0x7F80, 0xFF80]
    # Every bfloat16 that is a number decodes and encodes back to itself.
    every = np.arange(1 << 16, dtype=np.uint16)
    decoded = bf16_to_float32(every)
    numbers = ~np.isnan(decoded)
    assert (float32_to_bf16(decoded)[numbers] == every[numbers]).all()
    assert bf16_to_float32(np.array([0x3F80, 0x4049], dtype=np.uint16)).tolist() == [1.0, 3.140625]


def test_bf16_rounds_to_nearest_ties_to_even() -> None:
    one_ulp = 2.0**-7  # the spacing of bfloat16 above 1
    values = np.array(
        [1 + one_ulp / 2, 1 + 3 * one_ulp / 2, 1 + one_ulp / 2 + 2**-20, 1 + one_ulp / 2 - 2**-20, 3.4e38],
        dtype=np.float32,
    )
    assert float32_to_bf16(values).tolist() == [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x7F80]
    nan = float32_to_bf16(np.array([np.nan, -np.nan], dtype=np.float32))
    assert np.isnan(bf16_to_float32(nan)).all()
    assert float32_to_bf16(np.float32(1.0)).shape == ()  # a scalar stays a scalar


def test_cuda_problems_are_listed_and_cpu_ones_keep_their_c_view() -> None:
    assert builtin_problems("cuda") == CUDA_SUITE
    assert set(BF16_SUITE).isdisjoint(builtin_problems("cpu"))
    softmax = load_problem("softmax")
    assert softmax.backend == "cpu" and softmax.backends == ("cpu", "cuda")
    assert softmax.seed_source() != softmax.for_backend("cuda").seed_source()
    assert softmax.for_backend("cuda").for_backend("cpu") == softmax
    assert "TEMPLATE_PARAMS" not in str(softmax.for_backend("cuda").template_params)


def test_a_cuda_only_problem_has_no_c_view() -> None:
    problem = load_problem("softmax_bf16")
    assert problem.backend == "cuda" and problem.backends == ("cuda",)
    assert problem.entry == "softmax_bf16" and problem.signature.startswith('extern "C" __global__ void')
    with pytest.raises(UserError, match="has no cpu kernel"):
        problem.for_backend("cpu")
    with pytest.raises(UserError, match="has no cpu kernel"):
        problem_for_target(problem, "cpu")


def test_the_cuda_view_is_what_proposers_see(cuda_problem: Problem) -> None:
    assert cuda_problem.seed_source().lstrip().startswith("/*")
    assert f" {cuda_problem.entry}(" in cuda_problem.seed_source()
    source = cuda_problem.template_source() or ""
    assert set(re.findall(r"\{\{([A-Z_][A-Z0-9_]*)\}\}", source)) == set(cuda_problem.template_params)
    settings = template_space(cuda_problem)
    assert len(settings) >= 16
    for setting in settings:
        rendered = cuda_problem.render_template(setting)
        assert "{{" not in rendered and rendered.count("// kf-launch:") == 1
        assert "#include" not in rendered


def test_the_cuda_signature_follows_params() -> None:
    rmsnorm = load_problem("rmsnorm").for_backend("cuda")
    assert rmsnorm.signature == (
        'extern "C" __global__ void rmsnorm(const float *x, const float *w, float *y, long long rows, '
        "long long cols, float eps)"
    )
    bf16 = load_problem("rmsnorm_bf16")
    assert "const unsigned short *x, const unsigned short *w, unsigned short *y" in bf16.signature


def test_gpu_benchmark_shapes_are_memory_bound(cuda_problem: Problem) -> None:
    """Every row-reduction shape timed on a GPU moves at least 256 MiB: far past any L2 (B200: 126 MiB)."""
    shapes = cuda_problem.benchmark_shapes
    assert shapes != load_problem(cuda_problem.name).for_backend("cuda").module.BENCHMARK_SHAPES
    if cuda_problem.family == "row-reduction":
        for shape, _ in shapes:
            assert cuda_problem.roofline(shape)["bytes"] >= 256 << 20, shape


@pytest.mark.parametrize("name", BF16_SUITE)
def test_bf16_roofline_counts_two_bytes_per_element(name: str) -> None:
    problem, twin = load_problem(name), load_problem(name.removesuffix("_bf16"))
    shape = {"rows": 64, "cols": 1024}
    assert problem.roofline(shape)["bytes"] * 2 == twin.roofline(shape)["bytes"]


@pytest.mark.parametrize("name", BF16_SUITE)
def test_bf16_inputs_are_bit_patterns_and_the_reference_reads_them_decoded(name: str) -> None:
    problem = load_problem(name)
    shape = {"rows": 5, "cols": 33}
    inputs = problem.make_inputs(shape, "normal", 0)
    assert inputs["x"].dtype == np.uint16
    reference = problem.reference(inputs, shape)["y"]
    assert reference.dtype == np.float64 and reference.shape == (5, 33)
    with pytest.raises(UserError, match="has no parameter 'z'"):
        problem.decode_output("z", inputs["x"])


@pytest.mark.parametrize("name", BF16_SUITE)
def test_bf16_baseline_passes_and_coarser_answers_fail(name: str) -> None:
    """Guards the bfloat16 tolerances from both sides: float32 arithmetic rounded once passes everywhere, also
    against the reference rounded to bfloat16 (as the GPU judge compares); an answer rounded to two significant
    bits fewer than bfloat16 keeps (errors up to 2^-6) fails."""
    problem = load_problem(name)
    coarse_failed = 0
    for shape in problem.validation_shapes:
        for distribution in problem.distributions:
            inputs = problem.make_inputs(shape, distribution, 0)
            got = problem.baseline(inputs, shape)
            assert got["y"].dtype == np.uint16
            assert worst_ratio(problem, got, shape, inputs) <= 1.0, (shape, distribution)
            atol, rtol = problem.tolerance("bfloat16", shape, inputs)
            rounded = bf16_to_float32(float32_to_bf16(problem.reference(inputs, shape)["y"].astype(np.float32)))
            decoded = bf16_to_float32(got["y"]).astype(np.float64)
            assert (np.abs(decoded - rounded) <= atol + rtol * np.abs(rounded)).all(), (shape, distribution)
        inputs = problem.make_inputs(shape, "normal", 1)
        exact = problem.reference(inputs, shape)["y"].astype(np.float32)
        six_bits = (exact.view(np.uint32) + np.uint32(0x1FFFF)) >> np.uint32(18) << np.uint32(2)
        coarse_failed += worst_ratio(problem, {"y": six_bits.astype(np.uint16)}, shape, inputs) > 1.0
    assert coarse_failed >= len(problem.validation_shapes) // 2


def test_cuda_baselines_agree_with_the_reference(cuda_problem: Problem) -> None:
    """numpy stands in for cupy: the baseline's arithmetic is what a GPU runs."""
    for shape in cuda_problem.validation_shapes[:6]:
        for distribution in cuda_problem.distributions:
            inputs = cuda_problem.make_inputs(shape, distribution, 2)
            own = {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
            got = cuda_problem.cuda_baseline(np, own, shape)
            assert set(got) == {p.name for p in cuda_problem.outputs}
            assert worst_ratio(cuda_problem, got, shape, inputs) <= 1.0, (shape, distribution)


def test_cuda_problem_files_are_package_data() -> None:
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"*/*.cu"' in pyproject


def test_targets_name_their_backend() -> None:
    assert backend_kind("cpu") == "cpu" and backend_kind("cpu-x86_64-avx2") == "cpu"
    assert backend_kind("cuda-sm90") == "cuda"
    assert arch_of("cuda-sm90") == "sm_90" and arch_of("cuda-sm90a") == "sm_90a" and arch_of("cuda-sm100") == "sm_100"
    cuda = backend_for("cuda-sm100")
    assert (cuda.kind, cuda.artifact_kind, cuda.library_reference.label) == ("cuda", "cubin", "cupy")
    assert backend_for("cpu").library_reference.label == "numpy"
    for bad in ("gpu", "cuda-sm91", "cuda-90"):
        with pytest.raises(UserError, match="target"):
            backend_for(bad)


def _cuda_folder(tmp_path: Path, problem_py: str) -> Path:
    folder = tmp_path / "scale"
    folder.mkdir()
    (folder / "problem.py").write_text(problem_py)
    (folder / "seed.cu").write_text("// kf-launch: grid=(cdiv(n, 256),) block=(256,)\n")
    return folder


CUDA_ONLY = """
import numpy as np
NAME = "scale"
PARAMS = [
    {"name": "x", "role": "in", "dtype": "float32", "shape": ["n"]},
    {"name": "y", "role": "out", "dtype": "float32", "shape": ["n"]},
    {"name": "n", "role": "size", "dtype": "int64"},
]
VALIDATION_SHAPES = [{"n": 7}]
BENCHMARK_SHAPES = [({"n": 1 << 20}, 1.0)]
TOLERANCES = {"float32": {"atol": 1e-6, "rtol": 1e-6}}
DISTRIBUTIONS = ["normal"]
CUDA_ENTRY = "scale"
def make_inputs(shape, distribution, rng): return {"x": rng.standard_normal(shape["n"]).astype(np.float32)}
def reference(inputs, shape): return {"y": 2.0 * inputs["x"].astype(np.float64)}
def baseline(inputs, shape): return {"y": 2 * inputs["x"]}
def cuda_baseline(cp, inputs, shape): return {"y": 2 * inputs["x"]}
def roofline(shape): return {"bytes": 8 * shape["n"], "flops": shape["n"]}
"""


def test_a_cuda_only_folder_needs_no_c_parts(tmp_path: Path) -> None:
    problem = load_problem(_cuda_folder(tmp_path, CUDA_ONLY))
    assert problem.backends == ("cuda",) and problem.entry == "scale"
    assert problem.seed_source().startswith("// kf-launch:")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('CUDA_ENTRY = "scale"', "", "declares no kernel"),
        ("def cuda_baseline(cp, inputs, shape)", "def other_baseline(cp, inputs, shape)", r"lacks \['cuda_baseline'\]"),
        ('CUDA_ENTRY = "scale"', 'CUDA_ENTRY = "scale"\nCUDA_SEED = "kernel.cu"', "names 'kernel.cu', which is not"),
        ('CUDA_ENTRY = "scale"', 'CUDA_ENTRY = "scale"\nCUDA_TEMPLATE = "seed.cu"', "needs CUDA_TEMPLATE_PARAMS"),
        ('CUDA_ENTRY = "scale"', 'CUDA_ENTRY = "scale"\nENTRY = "scale"', r"lacks \['SIGNATURE'\]"),
        (
            'CUDA_ENTRY = "scale"',
            'CUDA_ENTRY = "scale"\nCUDA_BENCHMARK_SHAPES = [({"m": 1}, 1.0)]',
            r"CUDA_BENCHMARK_SHAPES entry \{'m': 1\}",
        ),
    ],
)
def test_malformed_cuda_declarations_are_reported(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in CUDA_ONLY
    with pytest.raises(UserError, match=message):
        load_problem(_cuda_folder(tmp_path, CUDA_ONLY.replace(old, new)))
