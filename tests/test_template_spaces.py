"""The built-in CPU templates' search spaces: large enough to hold near-roofline kernels, and correct in every
setting the search may draw.

Every allowed setting must compile and validate (docs/problems.md), but compiling thousands is minutes per
problem; a seeded sample of each space plus its two corners (the first value of every parameter, and the
setting with the most parameters at their last value) runs here, with one validation seed each, two at a
time. The sample is fixed per seed, so a failure is reproducible with ``sample(problem)``.
"""

from __future__ import annotations

import ctypes
import math
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.harness.cpu import artifact_path, compile_source, harness_shim
from engine.harness.validation import validate_artifact
from engine.harness.verdicts import Verdict
from engine.problems import Problem, builtin_problems, load_problem
from engine.proposers.random_template import template_space

SAMPLE = 4
SAMPLE_SEED = 12
# The memory-bound problems need room for prefetching, blocking, streaming stores and vector widths.
MIN_SPACE = {"rmsnorm": 300, "softmax": 300, "bias_gelu": 300, "l2norm": 300, "add_rmsnorm": 300, "layernorm": 300}
PROBLEMS = builtin_problems("cpu")
# Paths a random draw may miss, checked in every run: softmax's blocked pipeline with partial blocks (the
# validation shapes' 37 and 17 rows), rows that are not a whole number of vectors (its unaligned loop), at
# both vector widths, with and without streaming stores, its blocks of adjacent rows and of rows from parts of
# the matrix (SPLIT; fewer rows than a block: 1 and 3).
_SOFTMAX_PIPE = {"ONLINE": 0, "EXP": 5, "SIMD": 0, "FUSED": 0, "KEEP": 1, "PF": 1024, "PIPE": 2}
_ROW_PIPE = {"ROWS": 4, "SIMD": 0, "FUSED": 0, "PF": 0, "PIPE": 1}
EXTRA: dict[str, list[dict[str, Any]]] = {
    "softmax": [
        {**_SOFTMAX_PIPE, "VEC": 256, "ROWS": 4, "UNROLL": 2, "ALIGN": 0, "NT": 0, "SPLIT": 1},
        {**_SOFTMAX_PIPE, "VEC": 512, "ROWS": 2, "UNROLL": 1, "ALIGN": 1, "NT": 1, "SPLIT": 0},
        {**_SOFTMAX_PIPE, "VEC": 512, "ROWS": 2, "UNROLL": 1, "ALIGN": 1, "NT": 1, "SPLIT": 1},
        {**_SOFTMAX_PIPE, "VEC": 256, "ROWS": 8, "UNROLL": 1, "ALIGN": 1, "NT": 1, "SPLIT": 1},
        # PIPE 3: chunks of long rows (4096 and 4099 columns with ROWS 1; 1000-1030 too with ROWS 2 and 4), rows
        # whose chunks start off y's vector boundary (4099), masked chunks that are all -inf, and blocks of rows for
        # the short ones.
        {**_SOFTMAX_PIPE, "ONLINE": 1, "PIPE": 3, "VEC": 512, "ROWS": 1, "UNROLL": 2, "ALIGN": 1, "NT": 1, "SPLIT": 0},
        {**_SOFTMAX_PIPE, "ONLINE": 1, "PIPE": 3, "VEC": 256, "ROWS": 2, "UNROLL": 1, "ALIGN": 0, "NT": 0, "SPLIT": 1},
        {**_SOFTMAX_PIPE, "ONLINE": 1, "PIPE": 3, "VEC": 512, "ROWS": 4, "UNROLL": 8, "ALIGN": 1, "NT": 0, "SPLIT": 0},
    ],
    # Short rows (at most 256 columns: the validation shapes' 1, 7 and 129) in blocks of SHORT rows, long ones in
    # blocks of ROWS, pipelined and not, of adjacent rows and of rows from parts of the matrix (SPLIT).
    "rmsnorm": [
        {**_ROW_PIPE, "PFL": 1, "VEC": 512, "ACC": 4, "NT": 1, "ALIGN": 1, "SHORT": 1, "SPLIT": 0},
        {
            **_ROW_PIPE,
            "PFL": 2,
            "VEC": 256,
            "ACC": 2,
            "NT": 0,
            "ALIGN": 0,
            "SHORT": 2,
            "PF": 1024,
            "PIPE": 0,
            "SPLIT": 0,
        },
        # Blocks of rows from parts of the matrix: 37 rows in 4 parts of 9 and one left over, 3 rows all left over.
        {**_ROW_PIPE, "PFL": 1, "VEC": 512, "ACC": 4, "NT": 1, "ALIGN": 1, "SHORT": 0, "SPLIT": 1},
        {**_ROW_PIPE, "PFL": 1, "VEC": 256, "ACC": 2, "NT": 0, "ALIGN": 0, "SHORT": 2, "PIPE": 0, "SPLIT": 1},
    ],
    "l2norm": [
        {**_ROW_PIPE, "VEC": 512, "ACC": 4, "NT": 1, "ALIGN": 1, "SHORT": 1, "SPLIT": 0},
        {**_ROW_PIPE, "VEC": 512, "ACC": 4, "NT": 1, "ALIGN": 1, "SHORT": 0, "SPLIT": 1},
        {**_ROW_PIPE, "VEC": 256, "ACC": 2, "NT": 0, "ALIGN": 0, "SHORT": 2, "PIPE": 0, "SPLIT": 1},
    ],
    # Rows processed together from parts of the matrix, with rows left over (37, 17, 5 and 3 rows in blocks of 4 and 8).
    "bias_gelu": [
        {
            "VEC": 512,
            "ERF": "table",
            "DEG": 14,
            "EXP": "inline4",
            "SIMD": 0,
            "UNROLL": 2,
            "NT": 1,
            "PF": 4096,
            "ALIGN": 1,
            "ROWS": 4,
            "SPLIT": 1,
        },
        {
            "VEC": 256,
            "ERF": "cheb",
            "DEG": 12,
            "EXP": "inline4",
            "SIMD": 0,
            "UNROLL": 1,
            "NT": 0,
            "PF": 0,
            "ALIGN": 0,
            "ROWS": 8,
            "SPLIT": 1,
        },
        # The 8-piece erfc, its peel and leftover lanes through one-lane vectors of the same permutes.
        {
            "VEC": 256,
            "ERF": "table8",
            "DEG": 14,
            "EXP": "inline4",
            "SIMD": 0,
            "UNROLL": 1,
            "NT": 1,
            "PF": 0,
            "ALIGN": 1,
            "ROWS": 2,
            "SPLIT": 0,
        },
    ],
    # Packed panels: a block's last columns padded with zeros (n = 1, 3, 5, 33, 65, 130 and 300 leave columns over at
    # NR 16 and 64), rows left over (MR 6: 37, 17, 257 rows), all of b packed, and a packed as well, in both loop
    # orders and with k split in blocks (1000 and 257 at KB 64).
    "matmul": [
        {"MB": 64, "NB": 256, "KB": 256, "MR": 4, "NR": 64, "ORDER": "ikj", "VEC": 512, "PACK": 1},
        {"MB": 16, "NB": 64, "KB": 64, "MR": 6, "NR": 16, "ORDER": "kij", "VEC": 256, "PACK": 1},
        {"MB": 32, "NB": 128, "KB": 64, "MR": 6, "NR": 64, "ORDER": "ikj", "VEC": 512, "PACK": 2},
        {"MB": 16, "NB": 64, "KB": 64, "MR": 6, "NR": 16, "ORDER": "kij", "VEC": 256, "PACK": 3},
    ],
    "add_rmsnorm": [
        {**_ROW_PIPE, "PFL": 1, "VEC": 256, "ACC": 4, "NT": 1, "ALIGN": 1, "SHORT": 2, "SPLIT": 0},
        {**_ROW_PIPE, "PFL": 1, "VEC": 512, "ACC": 4, "NT": 1, "ALIGN": 1, "SHORT": 0, "SPLIT": 1},
        {**_ROW_PIPE, "PFL": 1, "VEC": 256, "ACC": 2, "NT": 0, "ALIGN": 0, "SHORT": 2, "PIPE": 0, "SPLIT": 1},
    ],
}


def corners(problem: Problem, space: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The allowed settings nearest each end of every parameter's list of values."""
    values = problem.template_params

    def rank(params: dict[str, Any]) -> int:
        return sum(values[name].index(value) for name, value in params.items())

    return [min(space, key=rank), max(space, key=rank)]


def sample(problem: Problem) -> list[dict[str, Any]]:
    """The settings checked for ``problem``: its corners and a seeded random draw, without repeats."""
    space = template_space(problem)
    chosen = corners(problem, space) + [s for s in EXTRA.get(problem.name, []) if s in space]
    rest = [s for s in space if s not in chosen]
    return chosen + random.Random(f"{SAMPLE_SEED}-{problem.name}").sample(rest, min(SAMPLE, len(rest)))


def check(problem: Problem, params: dict[str, Any], cache: Path) -> str:
    """'ok', or what went wrong with this setting."""
    compiled = compile_source(problem, problem.render_template(params), cache_dir=cache)
    if compiled.verdict != Verdict.ok or compiled.artifact_id is None:
        return f"compile: {compiled.first_error}"
    report = validate_artifact(problem, compiled.artifact_id, seeds=1, cache_dir=cache)
    return "ok" if report.verdict == Verdict.ok else f"{report.verdict}: {report.message}"


CASES = [(name, params) for name in PROBLEMS for params in sample(load_problem(name))]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every sampled setting compiled and validated, two at a time (compiling is most of the cost)."""
    cache = tmp_path_factory.mktemp("kf-spaces")
    # Built once before the threads start: two first builds in one process race on one temporary file name.
    harness_shim(cache)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {_id(name, params): pool.submit(check, load_problem(name), params, cache) for name, params in CASES}
        return {key: future.result() for key, future in futures.items()}


def _id(name: str, params: dict[str, Any]) -> str:
    return name + " " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))


@pytest.mark.parametrize(("name", "params"), CASES, ids=[_id(n, p) for n, p in CASES])
def test_sampled_setting_compiles_and_validates(name: str, params: dict[str, Any], outcomes: dict[str, str]) -> None:
    assert outcomes[_id(name, params)] == "ok"


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_every_path_checked_in_every_run_is_in_its_space(name: str) -> None:
    # sample() keeps only the EXTRA settings the space holds: one that lost a knob the template gained would
    # drop out of the run without a word.
    space = template_space(load_problem(name))
    assert [s for s in EXTRA[name] if s not in space] == []


@pytest.mark.parametrize("name", PROBLEMS)
def test_space_is_large_and_every_value_is_reachable(name: str) -> None:
    problem = load_problem(name)
    space = template_space(problem)
    assert len(space) >= MIN_SPACE.get(name, 1), f"{name}: {len(space)} settings"
    for param, values in problem.template_params.items():
        used = {s[param] for s in space}
        assert used == set(values), f"{name}: {param} values {set(values) - used} are excluded everywhere"


def _template_kernel(problem: Problem, params: dict[str, Any], cache: Path, arguments: int) -> Any:
    """``problem``'s template at ``params`` compiled and loaded: its entry point, taking ``arguments`` pointers and
    then the two sizes. Our own template, not a candidate: loading it here, outside the sandbox, is safe."""
    assert problem.template_allows(params)
    compiled = compile_source(problem, problem.render_template(params), cache_dir=cache)
    assert compiled.artifact_id is not None, compiled.first_error
    function = getattr(ctypes.CDLL(str(artifact_path(compiled.artifact_id, cache))), problem.entry)
    function.argtypes = [ctypes.c_void_p] * arguments + [ctypes.c_int64] * 2
    function.restype = None
    return function


def test_the_least_accurate_gelu_settings_stay_within_tolerance(tmp_path: Path) -> None:
    """Validation draws a few thousand z; the cheapest erf and exp polynomials are checked on a dense grid of
    z across the whole range where gelu is neither z nor 0, plus the cancellation tail (z < -3), and the
    piecewise erfc at every piece's ends."""
    problem = load_problem("bias_gelu")
    ends = np.arange(33) / 8.0 * math.sqrt(2.0)
    near_ends = np.concatenate([ends + d for d in (-1e-6, 0.0, 1e-6)])
    z = np.concatenate([np.linspace(-8.0, 8.0, 400_000), np.linspace(-6.0, -2.0, 400_000), near_ends, -near_ends])
    cols = 1000
    # Zeros fill the last row (gelu(0) = 0 is one more point worth checking).
    z = np.concatenate([z, np.zeros(-len(z) % cols)]).astype(np.float32)
    x = np.ascontiguousarray(z.reshape(-1, cols))
    b = np.zeros(cols, dtype=np.float32)
    shape = {"rows": x.shape[0], "cols": cols}
    expected = problem.reference({"x": x, "b": b}, shape)["y"]
    atol, rtol = problem.tolerance("float32", shape, {"x": x, "b": b})
    base = {"VEC": 512, "SIMD": 0, "UNROLL": 2, "NT": 0, "PF": 0, "ALIGN": 1, "ROWS": 1, "SPLIT": 0}
    for params in (
        base | {"ERF": "cheb", "DEG": 11, "EXP": "inline4"},
        base | {"ERF": "poly", "DEG": 14, "EXP": "inline4"},
        # The piecewise erfc, with its coefficients permuted across two registers (512) and four (256).
        base | {"ERF": "table", "DEG": 14, "EXP": "inline4"},
        base | {"ERF": "table", "DEG": 14, "EXP": "inline4", "VEC": 256, "ROWS": 4},
        # Its 8 pieces of degree 6, one register a coefficient (half of one at 512 bits with AVX-512).
        base | {"ERF": "table8", "DEG": 14, "EXP": "inline4"},
        base | {"ERF": "table8", "DEG": 14, "EXP": "inline4", "VEC": 256, "ROWS": 4},
    ):
        function = _template_kernel(problem, params, tmp_path, arguments=3)
        y = np.full_like(x, np.nan)
        function(x.ctypes.data, b.ctypes.data, y.ctypes.data, shape["rows"], cols)
        worst = float(np.max(np.abs(y - expected) / (atol + rtol * np.abs(expected))))
        assert math.isfinite(worst) and worst < 0.75, f"{params}: error {worst:.2f} of the tolerance"


def test_softmax_chunks_are_combined_into_the_rows_max_and_sum(tmp_path: Path) -> None:
    """PIPE 3 reduces a long row chunk by chunk, each relative to its own max, and writes the row before from the one
    scratch row as it goes. Rows built so that a wrong combination shows: leading chunks that are all -inf (a
    chunk's max of -inf makes x - max NaN), the row's max in its last chunk, every chunk's max far apart, one
    element standing out of a row of -1e9, a row shorter than a chunk after long ones, and 4099 columns (chunks
    off y's vector boundary from the second row on)."""
    problem = load_problem("softmax")
    cols = 4099
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, cols))
    x[0, :1500] = -np.inf
    x[1, -1] += 60.0
    x[2] = np.repeat(np.arange(17)[::-1] * 9.0, 256)[:cols] + rng.standard_normal(cols)
    x[3] = -1e9
    x[3, 2222] = 0.5
    x[4] *= 30.0
    x[5, 100:] = -1e4
    x = np.ascontiguousarray(x, dtype=np.float32)
    shape = {"rows": x.shape[0], "cols": cols}
    expected = problem.reference({"x": x}, shape)["y"]
    atol, rtol = problem.tolerance("float32", shape, {"x": x})
    base = {"ONLINE": 1, "EXP": 4, "SIMD": 0, "FUSED": 0, "KEEP": 1, "PF": 1024, "PIPE": 3, "ROWS": 1, "SPLIT": 0}
    for params in (
        base | {"VEC": 512, "UNROLL": 1, "ALIGN": 1, "NT": 1},
        base | {"VEC": 256, "UNROLL": 2, "ALIGN": 0, "NT": 0},
        base | {"VEC": 512, "UNROLL": 4, "ALIGN": 1, "NT": 0, "ROWS": 2, "SPLIT": 1},
    ):
        function = _template_kernel(problem, params, tmp_path, arguments=2)
        for rows in (6, 1):
            y = np.full_like(x, np.nan)
            function(x.ctypes.data, y.ctypes.data, rows, cols)
            worst = float(np.max(np.abs(y[:rows] - expected[:rows]) / (atol + rtol * np.abs(expected[:rows]))))
            assert math.isfinite(worst) and worst < 0.5, f"{params}, {rows} rows: error {worst:.2f} of the tolerance"


def _native_macros() -> set[str]:
    """The macros ``cc -march=native`` predefines (its ISA: __AVX__, __AVX512F__, ...)."""
    import subprocess

    listing = subprocess.run(
        ["cc", "-march=native", "-dM", "-E", "-x", "c", "/dev/null"], check=True, capture_output=True, text=True
    ).stdout
    return {line.split()[1] for line in listing.splitlines() if line.startswith("#define ")}


@pytest.mark.parametrize(
    ("name", "setting"),
    [("softmax", {"PIPE": 2, "ROWS": 2}), ("bias_gelu", {"ERF": "table"}), ("bias_gelu", {"ERF": "table8"})],
)
def test_vec_512_without_avx512_is_two_avx_vectors_per_step(name: str, setting: dict[str, Any], tmp_path: Path) -> None:
    # GCC lowers a comparison of 512-bit vectors lane by lane where the machine has no AVX-512 (VEC 512 ran 4-5x
    # slower than VEC 256 on an AVX2 machine): there the templates compile VEC 512 as VEC 256 with UNROLL
    # doubled, the same work per step. The two settings must build to the same machine code.
    import subprocess

    macros = _native_macros()
    if "__AVX__" not in macros or "__AVX512F__" in macros:
        pytest.skip("needs an x86 machine with AVX and without AVX-512")
    problem = load_problem(name)
    base = next(
        s for s in template_space(problem) if s["VEC"] == 512 and s["UNROLL"] == 1 and setting.items() <= s.items()
    )
    assemblies = []
    for params in (base, base | {"VEC": 256, "UNROLL": 2}):
        source = tmp_path / "kernel.c"
        source.write_text(problem.render_template(params))
        assemblies.append(
            subprocess.run(
                ["cc", "-O3", "-march=native", "-ffast-math", "-S", "-o", "-", str(source)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
    assert assemblies[0] == assemblies[1]
